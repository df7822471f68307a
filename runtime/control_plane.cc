#include "runtime/control_plane.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>

#include "common/error.h"
#include "common/summary_stats.h"
#include "placement/cost_model.h"
#include "placement/optimizer.h"
#include "placement/placement_diff.h"
#include "placement/placement_file.h"
#include "routing/stats_file.h"

namespace moed::runtime {

using nlohmann::json;

// The coordinator's view of the running (or last) migration.
struct ControlPlane::Migration {
  std::uint64_t id = 0;
  std::vector<placement::Move> moves;
  std::string state;  // prepare, transfer, verify, commit, release, committed, aborted
  std::string why;    // "migrate" or "reoptimize"
  std::size_t bytes = 0, done = 0;
  std::string error;
  std::vector<std::uint64_t> expected;  // source checksum per move
  std::vector<std::string> refusals, failures, mismatches;
  double transfer_seconds = 0;  // sum over boundaries of the slowest source's send time
  std::vector<double> step_ms_before, step_ms_during;  // wall times of steps
  bool active() const { return state != "committed" && state != "aborted"; }
};

namespace {

json moves_json(const std::vector<placement::Move>& moves) {
  json out = json::array();
  for (const auto& m : moves) out.push_back({m.layer, m.expert, m.from, m.to, m.drop});
  return out;
}

std::vector<placement::Move> moves_from(const json& list) {
  std::vector<placement::Move> moves;
  for (const auto& m : list) moves.push_back({m[0], m[1], m[2], m[3], m[4]});
  return moves;
}

json cost_json(const placement::Cost& now, const placement::Cost& after) {
  auto pair = [](double a, double b) { return json{{"now", a}, {"after", b}}; };
  return {{"cross_island_copies_per_token",
           pair(now.cross_island_copies_per_token, after.cross_island_copies_per_token)},
          {"same_island_copies_per_token",
           pair(now.same_island_copies_per_token, after.same_island_copies_per_token)},
          {"max_mean_rank_load", pair(now.max_mean_rank_load, after.max_mean_rank_load)},
          {"link_cost_per_token", pair(now.link_cost_per_token, after.link_cost_per_token)}};
}

json placement_json(const placement::Placement& p) {
  json layers = json::array();
  for (int l = 0; l < p.layers(); ++l) {
    json experts = json::array();
    for (int e = 0; e < p.experts(); ++e) experts.push_back(p.replicas(l, e));
    layers.push_back(experts);
  }
  return {{"epoch", p.epoch()}, {"ranks", p.ranks()}, {"layers", p.layers()}, {"experts", p.experts()},
          {"slots", layers}};
}

json stats_summary(const routing::RoutingStats& s) {
  json layers = json::array();
  for (int l = 0; l < s.layers(); ++l) {
    int hot = 0, pa = 0, pb = s.experts() > 1 ? 1 : 0;
    double total = 0;
    for (int e = 0; e < s.experts(); ++e) {
      total += s.load(l, e);
      if (s.load(l, e) > s.load(l, hot)) hot = e;
    }
    for (int a = 0; a < s.experts(); ++a)
      for (int b = a + 1; b < s.experts(); ++b)
        if (s.coactivation(l, a, b) > s.coactivation(l, pa, pb)) pa = a, pb = b;
    const double mean = total / s.experts();
    layers.push_back({{"layer", l},
                      {"tokens", s.tokens(l)},
                      {"hottest_expert", hot},
                      {"hottest_over_mean", mean > 0 ? s.load(l, hot) / mean : 0.0},
                      {"top_pair", {pa, pb}}});
  }
  return {{"steps", s.steps()}, {"half_life_steps", s.half_life_steps()},
          {"sample_tokens", s.sample_size()}, {"per_layer", layers}};
}

}  // namespace

ControlPlane::ControlPlane(ControlContext context)
    : c_(context), windows_(context.transport), faults_(MigrationFaults::from_env()) {
  std::lock_guard lock(snapshot_mu_);
  placement_json_ = placement_json(c_.placement);
}

ControlPlane::~ControlPlane() = default;

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
  std::lock_guard lock(snapshot_mu_);
  last_stats_ = merged;
  return merged;
}

bool ControlPlane::boundary(std::uint64_t step) {
  // Nothing to do (the usual step) travels as empty text: one small broadcast.
  std::string text;
  if (c_.rank == 0) {
    const json decided = decide();
    if (!decided["ops"].empty() || decided["stop"].get<bool>()) text = decided.dump();
  }
  c_.control.broadcast_text(text, fmt::format("control actions of step {}", step));
  const json actions = text.empty() ? json::object() : json::parse(text);
  apply(actions);
  return !actions.value("stop", false);
}

json ControlPlane::decide() {
  json ops = json::array();
  std::deque<std::pair<admin::Request, admin::Reply>> requests;
  {
    std::lock_guard lock(queue_mu_);
    requests.swap(queue_);
  }
  const bool busy_before = (migration_ && migration_->active()) || reoptimize_.has_value();
  const std::uint64_t running_before = migration_ ? migration_->id : 0;
  for (auto& [request, reply] : requests) {
    const json& p = request.params;
    const std::string& cmd = request.cmd;
    const bool busy = (migration_ && migration_->active()) || reoptimize_.has_value() || busy_before;
    if (cmd == "shutdown") {
      stopping_ = true;
      reply(admin::answer_ok(request.id, {{"state", "stopping"}}));
    } else if (cmd == "drain") {
      draining_ = true;
      reply(admin::answer_ok(request.id, {{"state", "draining"}}));
    } else if (stopping_ || draining_) {
      reply(admin::answer_error(request.id, "shutting_down", "the daemon is stopping"));
    } else if (busy) {
      reply(admin::answer_error(request.id, "busy",
                                migration_ && migration_->active()
                                    ? fmt::format("migration {} is running ({})", migration_->id, migration_->state)
                                    : "a re-optimisation is being planned"));
    } else if (cmd == "migrate") {
      const int layer = p.at("layer"), expert = p.at("expert"), to = p.at("to");
      const auto& P = c_.placement;
      if (layer >= P.layers() || expert >= P.experts() || to >= P.ranks()) {
        reply(admin::answer_error(request.id, "bad_params",
                                  fmt::format("layer {} expert {} rank {}: the model has {} layers x {} experts on {} ranks",
                                              layer, expert, to, P.layers(), P.experts(), P.ranks())));
        continue;
      }
      const std::vector<int>& holders = P.replicas(layer, expert);
      if (std::find(holders.begin(), holders.end(), to) != holders.end()) {
        reply(admin::answer_error(request.id, "refused",
                                  fmt::format("rank {} already holds layer {} expert {}", to, layer, expert)));
        continue;
      }
      int from = p.contains("from") ? int(p.at("from")) : holders.front();
      if (std::find(holders.begin(), holders.end(), from) == holders.end()) {
        reply(admin::answer_error(request.id, "bad_params",
                                  fmt::format("rank {} does not hold layer {} expert {}", from, layer, expert)));
        continue;
      }
      start_migration({{layer, expert, from, to, from}}, ops, "migrate");
      reply(admin::answer_ok(request.id, {{"migration", migration_json()}}));
    } else if (cmd == "reoptimize") {
      if (!c_.stats) {
        reply(admin::answer_error(request.id, "refused", "no routing statistics are kept"));
        continue;
      }
      reoptimize_.emplace(std::move(request), std::move(reply));
      ops.push_back({{"op", "gather_stats"}});
    } else {
      reply(admin::answer_error(request.id, "internal", "command " + cmd + " is not handled here"));
    }
  }
  if (optimizing_.valid() && optimizing_.wait_for(std::chrono::seconds(0)) == std::future_status::ready)
    finish_reoptimize(ops);

  // The running migration's next stage, from the reports of the last boundary
  // (one started at this boundary waits for its prepare reports: refusals).
  if (migration_ && migration_->active() && migration_->id == running_before) {
    Migration& m = *migration_;
    auto abort = [&](const std::string& why) {
      m.state = "aborted";
      m.error = why;
      spdlog::warn("migration {} aborted: {}", m.id, why);
      ops.push_back({{"op", "abort"}, {"id", m.id}});
    };
    if (stopping_ && m.state != "commit" && m.state != "release") {
      abort("the daemon is shutting down");
    } else if (m.state == "prepare" && !m.refusals.empty()) {
      abort("refused: " + m.refusals.front());
    } else if (!m.failures.empty()) {
      abort("transfer failed: " + m.failures.front());
    } else if (m.state == "prepare" || (m.state == "transfer" && m.done < m.bytes)) {
      m.state = "transfer";
      ops.push_back({{"op", "transfer"}, {"id", m.id}});
    } else if (m.state == "transfer") {
      m.state = "verify";
      ops.push_back({{"op", "verify"}, {"id", m.id}, {"expected", m.expected}});
    } else if (m.state == "verify" && !m.mismatches.empty()) {
      abort("checksum mismatch: " + m.mismatches.front());
    } else if (m.state == "verify") {
      m.state = "commit";
      ops.push_back({{"op", "commit"}, {"id", m.id}, {"epoch", c_.placement.epoch() + 1}});
    } else if (m.state == "commit") {
      m.state = "release";
      ops.push_back({{"op", "release"}, {"id", m.id}});
    } else if (m.state == "release") {
      m.state = "committed";
    }
  }
  const bool migrating = migration_ && migration_->active();
  const bool stop = stopping_ || (draining_ && !migrating && !reoptimize_);
  return {{"ops", ops}, {"stop", stop}};
}

void ControlPlane::start_migration(std::vector<placement::Move> moves, json& ops, const std::string& why) {
  migration_ = std::make_unique<Migration>();
  Migration& m = *migration_;
  m.id = next_migration_id_++;
  m.moves = std::move(moves);
  m.state = "prepare";
  m.why = why;
  const std::size_t slot = c_.store.slot_floats() * sizeof(float);
  for (const auto& mv : m.moves) m.bytes += mv.to >= 0 ? slot : 0;
  m.expected.assign(m.moves.size(), 0);
  m.step_ms_before.assign(steady_step_ms_.begin(), steady_step_ms_.end());
  spdlog::info("migration {} ({}): {} slot move(s), {:.1f} MB", m.id, why, m.moves.size(), double(m.bytes) / 1e6);
  ops.push_back({{"op", "prepare"}, {"id", m.id}, {"moves", moves_json(m.moves)}});
  // Visible at once: a client that polls right after the answer finds it.
  std::lock_guard lock(snapshot_mu_);
  migration_snapshot_ = migration_json();
}

void ControlPlane::finish_reoptimize(json& ops) {
  json plan = optimizing_.get();
  auto [request, reply] = std::move(*reoptimize_);
  reoptimize_.reset();
  if (plan.contains("error")) {
    reply(admin::answer_error(request.id, "internal", plan["error"].get<std::string>()));
    return;
  }
  std::vector<placement::Move> moves = moves_from(plan["moves"]);
  json answer = {{"dry_run", request.params.value("dry_run", false)},
                 {"predicted", plan["predicted"]},
                 {"moves", json::array()},
                 {"migration", nullptr}};
  for (const auto& m : moves)
    answer["moves"].push_back({{"layer", m.layer}, {"expert", m.expert}, {"from", m.from}, {"to", m.to}, {"drop", m.drop}});
  if (!answer["dry_run"] && !moves.empty()) {
    start_migration(std::move(moves), ops, "reoptimize");
    answer["migration"] = migration_json();
  }
  reply(admin::answer_ok(request.id, answer));
}

void ControlPlane::apply(const json& actions) {
  bool report = false;
  send_seconds_ = 0;
  for (const json& op : actions.value("ops", json::array())) {
    const std::string kind = op.at("op");
    if (kind == "gather_stats") {
      std::optional<routing::RoutingStats> merged = gather_stats("routing statistics for reoptimize");
      if (c_.rank == 0 && reoptimize_ && !optimizing_.valid()) {
        // Plan on a thread of rank 0's own: steps go on meanwhile.
        const json params = reoptimize_->first.params;
        optimizing_ = std::async(std::launch::async, [stats = std::move(*merged), current = c_.placement,
                                                      topology = c_.topology, params]() -> json {
          try {
            placement::OptimizeOptions o;
            o.policy = params.value("policy", std::string("metis"));
            placement::Placement next = placement::optimize(stats, topology, o);
            next = placement::relabel_to_minimise_moves(current, next, topology);
            routing::RoutingTrace sample = stats.sample_trace();
            if (params.contains("max_moves"))
              next = placement::limit_moves(current, next, params["max_moves"], sample, topology);
            json predicted = cost_json(placement::evaluate(sample, current, topology),
                                       placement::evaluate(sample, next, topology));
            return {{"moves", moves_json(placement::moves(current, next))}, {"predicted", predicted}};
          } catch (const std::exception& e) {
            return {{"error", e.what()}};
          }
        });
      }
    } else if (kind == "prepare") {
      refusal_.reset();
      failure_.reset();
      bad_checksums_.clear();
      transfer_ = std::make_unique<MigrationTransfer>(op.at("id"), moves_from(op.at("moves")), c_.rank,
                                                      c_.store, c_.transport, windows_, faults_);
      refusal_ = transfer_->prepare(std::size_t(c_.config.migration.memory_mb * 1e6));
      report = true;
    } else if (kind == "transfer") {
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
    } else if (kind == "verify") {
      bad_checksums_ = transfer_->verify(op.at("expected").get<std::vector<std::uint64_t>>());
      report = true;
    } else if (kind == "commit") {
      transfer_->install();  // the new slots serve before the placement names them
      placement::Placement next = placement::apply_moves(c_.placement, transfer_->moves());
      next.set_epoch(op.at("epoch"));
      c_.placement = std::move(next);
      commit_placement();
    } else if (kind == "release") {
      transfer_->release();
      transfer_.reset();
      if (!c_.config.migration.keep_window) windows_.drop();  // collective, like every op
    } else if (kind == "abort") {
      transfer_.reset();
      windows_.drop();  // it may hold a refusing rank's empty part, or corrupted bytes
    }
  }
  if (!report) return;
  std::vector<std::string> all = c_.control.all_gather_strings(my_report().dump(), "migration reports");
  if (c_.rank != 0) return;
  std::vector<json> reports;
  for (const auto& text : all) reports.push_back(json::parse(text));
  absorb_reports(reports);
}

json ControlPlane::my_report() const {
  json r = {{"sent", transfer_ ? transfer_->sent_bytes() : 0}, {"send_s", send_seconds_}};
  if (refusal_) r["refused"] = *refusal_;
  if (failure_) r["failed"] = *failure_;
  if (transfer_ && transfer_->sent_bytes() == transfer_->bytes_to_send()) r["checksums"] = transfer_->source_checksums();
  if (!bad_checksums_.empty()) r["bad"] = bad_checksums_;
  return r;
}

void ControlPlane::absorb_reports(const std::vector<json>& reports) {
  if (!migration_) return;
  Migration& m = *migration_;
  m.done = 0;
  double slowest_send = 0;
  for (std::size_t r = 0; r < reports.size(); ++r) {
    const json& rep = reports[r];
    slowest_send = std::max(slowest_send, rep.value("send_s", 0.0));
    m.done += rep.value("sent", std::size_t{0});
    if (rep.contains("refused")) m.refusals.push_back(rep["refused"]);
    if (rep.contains("failed")) m.failures.push_back(rep["failed"]);
    if (rep.contains("checksums"))
      for (const auto& pair : rep["checksums"]) m.expected.at(pair[0].get<std::size_t>()) = pair[1];
    if (rep.contains("bad"))
      for (std::size_t i : rep["bad"].get<std::vector<std::size_t>>())
        m.mismatches.push_back(fmt::format("layer {} expert {} on rank {}", m.moves[i].layer, m.moves[i].expert, r));
  }
  m.transfer_seconds += slowest_send;
}

void ControlPlane::commit_placement() {
  if (c_.rank == 0) {
    if (!c_.config.placement.committed.empty())
      placement::write_placement_file(c_.placement, c_.config.placement.committed);
    spdlog::info("placement epoch {} committed{}", c_.placement.epoch(),
                 c_.config.placement.committed.empty() ? "" : " to " + c_.config.placement.committed);
  }
  std::lock_guard lock(snapshot_mu_);
  placement_json_ = placement_json(c_.placement);
}

json ControlPlane::migration_json() const {
  if (!migration_) return nullptr;
  const Migration& m = *migration_;
  json j = {{"id", m.id},       {"state", m.state}, {"why", m.why},   {"bytes", m.bytes},
            {"done_bytes", m.done}, {"moves", m.moves.size()}};
  if (!m.moves.empty()) {
    j["layer"] = m.moves[0].layer;
    j["expert"] = m.moves[0].expert;
    j["from"] = m.moves[0].from;
    j["to"] = m.moves[0].to;
  }
  if (!m.error.empty()) j["error"] = m.error;
  j["transfer_s"] = m.transfer_seconds;
  if (m.transfer_seconds > 0) j["transfer_gbps"] = double(m.done) / m.transfer_seconds / 1e9;
  j["steps_during"] = m.step_ms_during.size();
  if (!m.step_ms_during.empty()) j["step_ms_p99_during"] = percentile(m.step_ms_during, 0.99);
  if (!m.step_ms_before.empty()) j["step_ms_p99_before"] = percentile(m.step_ms_before, 0.99);
  return j;
}

void ControlPlane::publish(std::uint64_t step, const Summary* summary, double step_wall_ms) {
  if (c_.rank == 0) {
    if (migration_ && migration_->active()) {
      migration_->step_ms_during.push_back(step_wall_ms);
    } else {
      steady_step_ms_.push_back(step_wall_ms);
      if (steady_step_ms_.size() > 256) steady_step_ms_.pop_front();
    }
  }
  json status = {{"rank", c_.rank},
                 {"epoch", c_.placement.epoch()},
                 {"step", step},
                 {"state", stopping_ ? "stopping" : draining_ ? "draining" : "serving"},
                 {"migration", c_.rank == 0 ? migration_json() : json(nullptr)}};
  json alerts = json::array();
  std::string metrics;
  if (summary) {
    status["tokens_per_s"] = summary->tokens_per_s;
    const auto& m = c_.config.metrics;
    if (m.alert_load_std_over_mean > 0 && summary->load_std_over_mean > m.alert_load_std_over_mean)
      alerts.push_back(fmt::format("expert load std/mean {:.2f} over {:.2f}", summary->load_std_over_mean,
                                   m.alert_load_std_over_mean));
    if (m.alert_step_p99_ms > 0 && summary->step_p99_ms > m.alert_step_p99_ms)
      alerts.push_back(fmt::format("step p99 {:.1f} ms over {:.1f} ms", summary->step_p99_ms, m.alert_step_p99_ms));
    metrics = prometheus_text(*summary, c_.placement.epoch(), alerts,
                              migration_ ? migration_->done : 0, migration_ ? migration_->bytes : 0);
  }
  status["alerts"] = alerts;
  std::lock_guard lock(snapshot_mu_);
  status_ = status;
  if (summary) metrics_ = metrics;
  migration_snapshot_ = c_.rank == 0 ? migration_json() : json(nullptr);
}

json ControlPlane::snapshot_answer(const admin::Request& request) {
  std::lock_guard lock(snapshot_mu_);
  const std::string& cmd = request.cmd;
  if (cmd == "status") return status_.is_null() ? json{{"rank", c_.rank}, {"state", "starting"}} : status_;
  if (cmd == "metrics") {
    if (metrics_.empty()) return admin::error_body("refused", "no figures yet: metrics come from rank 0 after the warm-up");
    return {{"text", metrics_}};
  }
  if (cmd == "placement") return placement_json_;
  if (cmd == "migration") {
    if (migration_snapshot_.is_null()) return admin::error_body("refused", "no migration has run (ask rank 0)");
    if (request.params.contains("migration_id") && request.params["migration_id"] != migration_snapshot_["id"])
      return admin::error_body("refused", fmt::format("the last migration is {}", migration_snapshot_["id"].dump()));
    return {{"migration", migration_snapshot_}};
  }
  if (cmd == "stats") {
    if (!last_stats_) return admin::error_body("refused", "no statistics gathered yet (rank 0 gathers every [stats].every_steps)");
    json answer = stats_summary(*last_stats_);
    if (request.params.contains("dump")) {
      const std::string path = request.params["dump"];
      try {
        routing::write_stats_file(*last_stats_, path);
      } catch (const Error& e) {
        return admin::error_body(admin::code::kRefused, e.what());
      }
      answer["dump"] = path;
    }
    return answer;
  }
  return admin::error_body("internal", "command " + cmd + " has no snapshot");
}

void ControlPlane::finish() {
  reply_all_pending("shutting_down", "the daemon has stopped");
  if (optimizing_.valid()) optimizing_.wait();
}

void ControlPlane::reply_all_pending(const std::string& code, const std::string& message) {
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
