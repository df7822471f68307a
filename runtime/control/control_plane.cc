#include "runtime/control/control_plane.h"

#include <fmt/ranges.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <csignal>

#include "comm/control_channel.h"
#include "common/clock.h"
#include "common/error.h"
#include "placement/placement_diff.h"
#include "placement/placement_file.h"
#include "placement/survivors.h"
#include "routing/stats_file.h"
#include "runtime/control/control_views.h"
#include "runtime/observe/report.h"
#include "runtime/observe/snapshot.h"

namespace moed::runtime {

using nlohmann::json;

ControlPlane::ControlPlane(ControlContext context)
    : c_(context),
      numbers_(layer_numbers(context.config.model)),
      coordinator_([&store = context.store](int shards) { return store.slot_bytes(shards); }, context.stats != nullptr, numbers_),
      stats_writes_("the statistics file " + context.config.stats.file),
      windows_(comm::rma_weight_movers(context.transport), context.rank),
      faults_(MigrationFaults::from_env()) {
  // The committed placement is written before the switch: a file that cannot
  // be written aborts the migration while every rank is on the old epoch.
  coordinator_.set_before_commit([this](const MigrationRecord& m, std::uint64_t epoch) -> std::optional<std::string> {
    const std::string& path = c_.config.placement.committed;
    if (path.empty()) return std::nullopt;
    placement::Placement next = placement::apply_moves(c_.placement, m.moves);
    next.set_epoch(epoch);
    try {
      placement::write_placement_file(next, path, numbers_);
    } catch (const std::exception& e) {
      ++committed_write_failures_;
      return fmt::format("[placement].committed {} cannot be written: {}", path, e.what());
    }
    return std::nullopt;
  });
  publish_placement();
}

ControlPlane::~ControlPlane() = default;

void ControlPlane::save_stats(const routing::RoutingStats& merged, bool last) {
  const double now = now_seconds();
  if (!last && !stats_writes_.due(now)) return;  // backing off; the next gather tries again
  try {
    routing::write_stats_file(merged, c_.config.stats.file);
  } catch (const std::exception& e) {
    const std::string line = stats_writes_.failed(now, e.what());
    if (last) spdlog::error("{}", line); else spdlog::warn("{}", line);
    return;
  }
  if (const std::string line = stats_writes_.succeeded(); !line.empty()) spdlog::info("{}", line);
  spdlog::info("wrote {} ({} steps, {} sampled tokens)", c_.config.stats.file, merged.steps(), merged.sample_size());
}

void ControlPlane::abandon_for_loss() {
  // Detached from the window first: nothing then waits on a put to the lost rank.
  if (transfer_) transfer_->keep_landed();
  windows_.drop();
}

std::string ControlPlane::settle_after_loss(const std::vector<int>& lost_world) {
  c_.rank = c_.control.rank();
  c_.ranks = c_.control.size();
  windows_ = MigrationWindows(comm::rma_weight_movers(c_.transport), c_.rank);
  const std::uint64_t here = c_.placement.epoch();
  const auto newest = std::uint64_t(c_.control.all_max(int(here), "the newest placement epoch of the survivors"));
  last_migration_ =
      std::uint64_t(c_.control.all_max(int(last_migration_), "the newest migration any survivor prepared"));
  const std::string why = fmt::format("world rank(s) {} lost during it", fmt::join(lost_world, " "));

  std::optional<MigrationCoordinator::Settled> settled;
  std::string outcome;
  switch (after_loss(transfer_ != nullptr, switched_, verified_, here, newest)) {
    case AfterLoss::nothing:
      break;
    case AfterLoss::roll_back:
      outcome = fmt::format("migration {} rolled back", transfer_->id());
      break;
    case AfterLoss::roll_forward: {  // another survivor switched: so does this one, from what it kept
      placement::Placement next = placement::apply_moves(c_.placement, transfer_->moves());
      transfer_->install();
      next.set_epoch(newest);
      c_.placement = std::move(next);
      commit_placement();
      switched_ = true;
      outcome = fmt::format("migration {} committed here after the loss, as on a survivor that had switched",
                            transfer_->id());
      transfer_->release();
      break;
    }
    case AfterLoss::finish:
      outcome = fmt::format("migration {} committed", transfer_->id());
      transfer_->release();
      break;
  }
  if (transfer_) settled = MigrationCoordinator::Settled{transfer_->id(), transfer_->moves(), switched_};
  transfer_.reset();
  if (c_.rank == 0) {
    coordinator_.after_loss(settled, last_migration_, why);
    publish_migration();
    if (reoptimize_) {
      reoptimize_->second(admin::answer_error(reoptimize_->first.id, admin::code::kInternal,
                                              fmt::format("{} while the plan was made: ask again", why)));
      reoptimize_.reset();
    }
    if (optimizing_.valid()) {
      if (given_up_.valid()) given_up_.wait();  // a second loss within one plan's time: rare, and bounded by it
      given_up_ = std::move(optimizing_);
    }
  }
  return outcome;
}

void ControlPlane::submit(admin::Request request, admin::Reply reply) {
  std::lock_guard lock(queue_mu_);
  queue_.emplace_back(std::move(request), std::move(reply));
}

std::optional<routing::RoutingStats> ControlPlane::gather_stats(const std::string& what) {
  routing::RoutingStats merged = *c_.stats;
  merged.normalize();
  c_.control.reduce_sum(merged.raw().data(), merged.raw().size(), what);
  std::vector<std::uint32_t> mine = c_.stats->sample_cells();
  std::vector<std::byte> all = c_.control.gather(mine.data(), mine.size() * sizeof(std::uint32_t), what);
  if (c_.rank != 0) return std::nullopt;
  // Rank 0's own paths are in `merged` already; the others' follow, in rank order.
  std::span<const std::uint32_t> cells(reinterpret_cast<const std::uint32_t*>(all.data()),
                                       all.size() / sizeof(std::uint32_t));
  merged.append_sample_cells(cells.subspan(mine.size()));
  c_.snapshot.set_stats(std::make_shared<const routing::RoutingStats>(merged));
  return merged;
}

bool ControlPlane::boundary(std::uint64_t step) {
  std::string text;
  if (c_.rank == 0) {
    text = encode_actions(decide());
    if (!text.empty()) publish_migration();  // an abort shows at once, also at the last boundary
  }
  c_.control.broadcast_text(text, fmt::format("control actions of step {}", step));
  const BoundaryActions actions = decode_actions(text);
  follow_now_ = actions.follow;
  apply(actions);
  return !actions.stop;
}

BoundaryActions ControlPlane::decide() {
  std::deque<std::pair<admin::Request, admin::Reply>> requests;
  {
    std::lock_guard lock(queue_mu_);
    requests.swap(queue_);
  }
  coordinator_.begin_boundary();
  if (const int signal = c_.stop_signal ? c_.stop_signal() : 0; signal != 0 && !coordinator_.stopping()) {
    spdlog::warn("rank 0: {}: draining: the step in flight finishes, a migration before its switch aborts, "
                 "then the report and statistics are written (the same signal again ends it at once)",
                 c_.signal_name ? c_.signal_name(signal) : "a signal");
    coordinator_.shutdown();
    stopped_by_ = signal;
  }
  for (auto& [request, reply] : requests) {
    const json& p = request.params;
    const std::string& cmd = request.cmd;
    Verdict verdict;
    json body;
    if (cmd == "shutdown") {
      verdict = coordinator_.shutdown();
      body = {{"state", "stopping"}};
    } else if (cmd == "admit") {
      const std::int64_t count = p.value("count", std::int64_t(1));
      const std::vector<int> waiting =
          spares_waiting_ && count > 0 ? spares_waiting_(int(std::min<std::int64_t>(count, 1 << 20)))
                                       : std::vector<int>{};
      if (!spares_waiting_)
        verdict = {admin::code::kRefused, "admit needs spares: this job has none ([comm].elastic and [comm].spares)"};
      else if (count < 1)
        verdict = {admin::code::kBadParams, fmt::format("count = {}: admit at least one spare", count)};
      else if (coordinator_.busy())
        verdict = {admin::code::kBusy, "a migration runs or is planned: admit once it has ended"};
      else if (waiting.empty())
        verdict = {admin::code::kRefused, "no spare waits: each was admitted or lost ([comm].spares)"};
      else
        admitting_ = waiting, body = {{"admitting", waiting}};
    } else if (cmd == "drain") {
      verdict = coordinator_.drain();
      body = {{"state", "draining"}};
    } else if (cmd == "migrate") {
      const std::optional<int> from = p.contains("from") ? std::optional<int>(p.at("from")) : std::nullopt;
      const int asked = p.at("layer");  // the model's layer number
      if (const std::optional<int> layer = numbers_.moe(asked, c_.placement.layers()))
        verdict = coordinator_.migrate(c_.placement, *layer, p.at("expert"), p.at("to"), from, &c_.topology);
      else
        verdict = {admin::code::kBadParams,
                   numbers_.why_not(asked, c_.placement.layers()) + ": migrate moves an expert of an MoE layer"};
      if (verdict.ok()) {
        publish_migration();
        body = {{"migration", migration_json()}};
      }
    } else if (cmd == "trace_follow") {
      follow_asked_.push_back(p.at("request_id").get<std::uint64_t>());
      body = {{"following", p.at("request_id")}, {"sample", c_.config.trace.sample}};
    } else if (cmd == "reoptimize") {
      verdict = coordinator_.reoptimize();
      if (verdict.ok()) {  // answered when its plan is made
        reoptimize_.emplace(std::move(request), std::move(reply));
        continue;
      }
    } else {
      verdict = coordinator_.unknown_command(cmd);
    }
    reply(verdict.ok() ? admin::answer_ok(request.id, body)
                       : admin::answer_error(request.id, verdict.code, verdict.message));
  }
  if (optimizing_.valid() && optimizing_.wait_for(std::chrono::seconds(0)) == std::future_status::ready)
    finish_reoptimize();
  if (given_up_.valid() && given_up_.wait_for(std::chrono::seconds(0)) == std::future_status::ready) given_up_ = {};
  if (!newcomers_.empty() && !coordinator_.busy()) {
    std::vector<placement::Move> moves = placement::moves_to_newcomers(c_.placement, newcomers_);
    const std::size_t count = moves.size();
    if (coordinator_.rebalance(std::move(moves), "a rank joined")) {
      spdlog::info("rank 0: {} slot(s) migrate to the rank(s) that joined", count);
      publish_migration();
    }
    newcomers_.clear();
  }
  BoundaryActions out;
  const MigrationRecord* migration = coordinator_.migration();
  const auto state_before = migration ? std::optional(migration->state) : std::nullopt;
  out.actions = coordinator_.end_boundary(c_.placement.epoch());
  // A stage that ends with no action to send (release -> committed) shows at
  // once too: an idle front door takes no step whose figures would publish it,
  // and moectl follows the migration until it reads committed.
  migration = coordinator_.migration();
  if (migration && (!state_before || migration->state != *state_before)) publish_migration();
  out.stop = coordinator_.stop();
  // A joiner is reached between migrations: its share then moves by the next one.
  if (take_joiners_ && !coordinator_.busy() && !out.stop) out.arrivals = take_joiners_();
  out.follow = std::move(follow_asked_);
  follow_asked_.clear();
  return out;
}

void ControlPlane::finish_reoptimize() {
  ReoptimizePlan plan = optimizing_.get();
  auto [request, reply] = std::move(*reoptimize_);
  reoptimize_.reset();
  if (!plan.error.empty()) {
    coordinator_.plan_failed();
    reply(admin::answer_error(request.id, admin::code::kInternal, plan.error));
    return;
  }
  json answer = {{"dry_run", request.params.value("dry_run", false)},
                 {"predicted", predicted_json(plan.now, plan.after)},
                 {"pooling", plan.pooling.empty() ? json(nullptr) : json(plan.pooling)},
                 {"moves", json::array()},
                 {"migration", nullptr}};
  for (const auto& m : plan.moves) {
    json move = {{"layer", numbers_.model(m.layer)}, {"expert", m.expert}, {"from", m.from}, {"to", m.to},
                 {"drop", m.drop}};
    if (m.shards > 1) move.update({{"shard", m.shard}, {"shards", m.shards}, {"cut", m.cut}, {"copy", m.copy}});
    answer["moves"].push_back(std::move(move));
  }
  if (coordinator_.plan_ready(std::move(plan.moves), answer["dry_run"])) {
    publish_migration();
    answer["migration"] = migration_json();
  }
  reply(admin::answer_ok(request.id, answer));
}

void ControlPlane::apply(const BoundaryActions& actions) {
  using K = ControlAction::Kind;
  for (const JoinerArrival& arrival : actions.arrivals)
    if (reach_joiner_) reach_joiner_(arrival);
  bool report = false;
  send_seconds_ = 0;
  for (const ControlAction& op : actions.actions) {
    switch (op.kind) {
      case K::gather_stats: {
        std::optional<routing::RoutingStats> merged = gather_stats("routing statistics for reoptimize");
        if (c_.rank == 0 && reoptimize_ && !optimizing_.valid()) {
          // Plan on a thread of rank 0's own: steps go on meanwhile.
          const json& asked = reoptimize_->first.params;
          ReoptimizeRequest params;
          params.policy = asked.contains("policy")
                              ? placement::kOptimizerPolicyNames.parse(asked["policy"].get<std::string>(), "policy")
                              : c_.config.placement.reoptimize_policy;
          if (asked.contains("max_moves")) params.max_moves = asked["max_moves"].get<int>();
          params.slots_per_rank = int(c_.config.placement.layer_slots_per_rank);
          params.redundant_slots = int(c_.config.placement.redundant_slots);
          params.load_cap = c_.config.placement.load_cap;
          params.pooled_share = c_.config.placement.pooled_share;
          params.island_tolerance = c_.config.placement.island_tolerance;
          params.group_hint = c_.config.placement.group_hint;
          if (const int groups = model_spec(c_.config.model).router.groups; groups > 1) params.expert_groups = groups;
          params.shard_over_mean = c_.config.placement.shard_over_mean;
          params.shards = int(c_.config.placement.shards);
          params.shard_per_island = c_.config.placement.shard_per_island;
          params.redundancy = int(c_.config.placement.redundancy);
          params.ffn_chunks = int(c_.config.experts.ffn_chunks);
          optimizing_ = std::async(std::launch::async, [stats = std::move(*merged), current = c_.placement,
                                                        topology = c_.topology, params] {
            return plan_reoptimization(stats, current, topology, params);
          });
        }
        break;
      }
      case K::prepare:
        refusal_.reset();
        failure_.reset();
        bad_checksums_.clear();
        verified_ = switched_ = false;
        last_migration_ = op.migration;
        transfer_ = std::make_unique<MigrationTransfer>(op.migration, op.moves, c_.rank, c_.ranks, c_.store,
                                                        windows_, faults_);
        refusal_ = transfer_->prepare(std::size_t(c_.config.migration.memory_mb * 1e6));
        report = true;
        break;
      case K::transfer:
        if (!failure_) {
          const auto start = std::chrono::steady_clock::now();
          try {
            transfer_->send(std::size_t(c_.config.migration.chunk_mb * 1e6));
            send_seconds_ = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
          } catch (const std::exception& e) {
            failure_ = fmt::format("rank {}: {}", c_.rank, e.what());
          }
        }
        report = true;
        break;
      case K::verify:
        bad_checksums_ = transfer_->verify(op.expected);
        verified_ = bad_checksums_.empty();
        report = true;
        break;
      case K::commit: {
        if (faults_.killed_at_commit == c_.rank) {
          spdlog::warn("MOED_FAULT: rank {} dies at the commit of migration {}", c_.rank, op.migration);
          std::raise(SIGKILL);
        }
        placement::Placement next = placement::apply_moves(c_.placement, transfer_->moves());
        transfer_->install();  // the new slots serve before the placement names them
        next.set_epoch(op.epoch);
        c_.placement = std::move(next);
        commit_placement();
        switched_ = true;
        break;
      }
      case K::release:
        transfer_->release();
        transfer_.reset();
        if (!c_.config.migration.keep_window) windows_.drop();  // collective, like every op
        break;
      case K::abort:
        transfer_.reset();
        windows_.drop();  // it may hold a refusing rank's empty part, or corrupted bytes
        break;
    }
  }
  if (!report) return;
  std::vector<std::string> all = c_.control.all_gather_strings(encode_report(my_report()), "migration reports");
  if (c_.rank != 0) return;
  std::vector<StageReport> reports;
  for (const auto& text : all) reports.push_back(decode_report(text));
  coordinator_.absorb(reports);
}

StageReport ControlPlane::my_report() const {
  StageReport r;
  r.sent_bytes = transfer_ ? transfer_->sent_bytes() : 0;
  r.send_seconds = send_seconds_;
  r.refused = refusal_;
  r.failed = failure_;
  if (transfer_ && transfer_->sent_bytes() == transfer_->bytes_to_send()) r.checksums = transfer_->source_checksums();
  r.bad_moves = bad_checksums_;
  return r;
}

void ControlPlane::commit_placement() {
  if (c_.rank == 0) {  // the file was written before the switch (set_before_commit)
    spdlog::info("placement epoch {} committed{}", c_.placement.epoch(),
                 c_.config.placement.committed.empty() ? "" : " to " + c_.config.placement.committed);
  }
  publish_placement();
}

void ControlPlane::publish_placement() {
  const RouterSpec& router = model_spec(c_.config.model).router;
  const ExpertStore& store = c_.store;
  c_.snapshot.set_placement(placement_json(c_.placement, numbers_, {router.groups, router.groups_kept},
                                           {kernels::to_string(store.dtype()),
                                            [&store](int shards) { return store.slot_bytes(shards); }}));
}

json ControlPlane::migration_json() const { return runtime::migration_json(coordinator_.migration(), numbers_); }

// Visible at once: a client that polls right after an answer finds it.
void ControlPlane::publish_migration() { c_.snapshot.set_migration(migration_json()); }

void ControlPlane::publish(std::uint64_t step, const Summary* summary, double step_wall_ms) {
  if (c_.rank == 0) coordinator_.note_step(step_wall_ms);
  ControlState state;
  state.step = step;
  state.state = coordinator_.stopping() ? "stopping" : coordinator_.draining() ? "draining" : "serving";
  state.migration = c_.rank == 0 ? migration_json() : json(nullptr);
  state.now = now_seconds();
  if (stats_writes_.failing()) state.stats_file_alert = stats_writes_.alert(state.now);
  ControlFigures& figures = state.figures;
  figures.epoch = c_.placement.epoch();
  if (const MigrationRecord* migration = coordinator_.migration()) {
    figures.migration_done_bytes = migration->done;
    figures.migration_bytes = migration->bytes;
    figures.migration_state = std::string(state_name(migration->state));
  }
  figures.stats_write_failures = stats_writes_.failures();
  figures.committed_write_failures = committed_write_failures_;
  c_.snapshot.publish(state, summary);
}

void ControlPlane::finish() {
  reply_all_pending(admin::code::kShuttingDown, "the daemon has stopped");
  if (optimizing_.valid()) optimizing_.wait();
}

void ControlPlane::reply_all_pending(std::string_view code, const std::string& message) {
  std::deque<std::pair<admin::Request, admin::Reply>> requests;
  {
    std::lock_guard lock(queue_mu_);
    requests.swap(queue_);
  }
  for (auto& [request, reply] : requests) reply(admin::answer_error(request.id, code, message));
  if (reoptimize_) reoptimize_->second(admin::answer_error(reoptimize_->first.id, code, message));
  reoptimize_.reset();
}

}  // namespace moed::runtime
