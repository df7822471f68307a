#include "runtime/control/migration_coordinator.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>

#include "runtime/admin/protocol.h"

namespace moed::runtime {

std::string_view state_name(MigrationState state) {
  switch (state) {
    case MigrationState::prepare: return "prepare";
    case MigrationState::transfer: return "transfer";
    case MigrationState::verify: return "verify";
    case MigrationState::commit: return "commit";
    case MigrationState::release: return "release";
    case MigrationState::committed: return "committed";
    case MigrationState::aborted: return "aborted";
  }
  return "?";
}

std::string_view kind_name(ControlAction::Kind kind) {
  using K = ControlAction::Kind;
  switch (kind) {
    case K::gather_stats: return "gather_stats";
    case K::prepare: return "prepare";
    case K::transfer: return "transfer";
    case K::verify: return "verify";
    case K::commit: return "commit";
    case K::release: return "release";
    case K::abort: return "abort";
  }
  return "?";
}

namespace {
ControlAction action(ControlAction::Kind kind, std::uint64_t migration) {
  ControlAction a;
  a.kind = kind;
  a.migration = migration;
  return a;
}
}  // namespace

MigrationCoordinator::MigrationCoordinator(SlotBytes slot_bytes, bool stats_kept, LayerNumbers numbers)
    : slot_bytes_(std::move(slot_bytes)), stats_kept_(stats_kept), numbers_(std::move(numbers)) {}

void MigrationCoordinator::begin_boundary() {
  actions_.clear();
  busy_at_begin_ = busy();
  running_at_begin_ = migration_ && migration_->active() ? migration_->id : 0;
}

Verdict MigrationCoordinator::shutdown() {
  stopping_ = true;
  return {};
}

Verdict MigrationCoordinator::drain() {
  draining_ = true;
  return {};
}

// Requests that start work are refused while stopping, and while a migration
// or a plan is under way (also one that ended at this boundary: its ranks
// have not yet applied the end).
Verdict MigrationCoordinator::refuse_if_unavailable() const {
  if (stopping_ || draining_) return {admin::code::kShuttingDown, "the daemon is stopping"};
  if (migration_ && migration_->active())
    return {admin::code::kBusy,
            fmt::format("migration {} is running ({})", migration_->id, state_name(migration_->state))};
  if (planning_ || busy_at_begin_) return {admin::code::kBusy, "a re-optimisation is being planned"};
  return {};
}

Verdict MigrationCoordinator::migrate(const placement::Placement& p, int layer, int expert, int to,
                                      std::optional<int> from, const placement::Topology* topology) {
  if (Verdict v = refuse_if_unavailable(); !v.ok()) return v;
  // `layer` is an MoE layer (the control plane maps the model layer a request names).
  if (layer < 0 || layer >= p.layers())
    return {admin::code::kBadParams, fmt::format("MoE layer {}: the model has {}", layer, p.layers())};
  const int shown = numbers_.model(layer);  // what messages call the layer
  if (expert < 0 || to < 0 || expert >= p.experts() || to >= p.ranks())
    return {admin::code::kBadParams,
            fmt::format("layer {} expert {} rank {}: the model has {} experts per layer on {} ranks", shown, expert,
                        to, p.experts(), p.ranks())};
  const std::vector<int>& holders = p.replicas(layer, expert);
  if (std::find(holders.begin(), holders.end(), to) != holders.end())
    return {admin::code::kRefused, fmt::format("rank {} already holds layer {} expert {}", to, shown, expert)};
  const int source = from.value_or(holders.front());
  if (std::find(holders.begin(), holders.end(), source) == holders.end())
    return {admin::code::kBadParams, fmt::format("rank {} does not hold layer {} expert {}", source, shown, expert)};
  const int shards = p.shards(layer, expert);
  if (shards > 1 && topology && topology->island_of(to) != topology->island_of(source))
    return {admin::code::kRefused,
            fmt::format("layer {} expert {} is split into {} shards, rank {}'s on island {}; rank {} is on island "
                        "{} (the shards of a copy of an expert share an island)",
                        shown, expert, shards, source, topology->island_of(source), to, topology->island_of(to))};
  // A split expert's shard held by `source` moves whole.
  start({{layer, expert, source, to, source, p.shard_on(layer, expert, source), shards, false,
          p.copy_on(layer, expert, source)}},
        "migrate");
  return {};
}

Verdict MigrationCoordinator::reoptimize() {
  if (Verdict v = refuse_if_unavailable(); !v.ok()) return v;
  if (!stats_kept_) return {admin::code::kRefused, "no routing statistics are kept"};
  planning_ = true;
  actions_.push_back(action(ControlAction::Kind::gather_stats, 0));
  return {};
}

Verdict MigrationCoordinator::unknown_command(const std::string& cmd) {
  if (Verdict v = refuse_if_unavailable(); !v.ok()) return v;
  return {admin::code::kInternal, "command " + cmd + " is not handled here"};
}

bool MigrationCoordinator::plan_ready(std::vector<placement::Move> moves, bool dry_run) {
  planning_ = false;
  if (dry_run || moves.empty()) return false;
  start(std::move(moves), "reoptimize");
  return true;
}

void MigrationCoordinator::plan_failed() { planning_ = false; }

bool MigrationCoordinator::rebalance(std::vector<placement::Move> moves, const std::string& why) {
  if (busy() || stopping_ || draining_ || moves.empty()) return false;
  start(std::move(moves), why);
  return true;
}

std::size_t MigrationCoordinator::sent_bytes(const std::vector<placement::Move>& moves) const {
  // What the sources send: a holder that keeps a shard of the expert it splits cuts it in place.
  std::size_t bytes = 0;
  for (const auto& mv : moves) bytes += mv.to >= 0 && mv.to != mv.from ? slot_bytes_(mv.shards) : 0;
  return bytes;
}

void MigrationCoordinator::start(std::vector<placement::Move> moves, const std::string& why) {
  MigrationRecord& m = migration_.emplace();
  m.id = next_id_++;
  m.moves = std::move(moves);
  m.why = why;
  m.bytes = sent_bytes(m.moves);
  m.expected.assign(m.moves.size(), 0);
  for (double ms : steady_step_ms_) m.step_ms_before.add(ms);
  spdlog::info("migration {} ({}): {} slot move(s), {:.1f} MB", m.id, why, m.moves.size(), double(m.bytes) / 1e6);
  actions_.push_back(action(ControlAction::Kind::prepare, m.id));
  actions_.back().moves = m.moves;
}

void MigrationCoordinator::abort(const std::string& why) {
  MigrationRecord& m = *migration_;
  m.state = MigrationState::aborted;
  m.error = why;
  spdlog::warn("migration {} aborted: {}", m.id, why);
  actions_.push_back(action(ControlAction::Kind::abort, m.id));
}

std::vector<ControlAction> MigrationCoordinator::end_boundary(std::uint64_t epoch) {
  if (migration_ && migration_->active() && migration_->id == running_at_begin_) advance(epoch);
  return std::move(actions_);
}

void MigrationCoordinator::advance(std::uint64_t epoch) {
  using S = MigrationState;
  using K = ControlAction::Kind;
  MigrationRecord& m = *migration_;
  std::optional<std::string> failure;
  if (stopping_ && m.state != S::commit && m.state != S::release) {
    abort("the daemon is shutting down");
  } else if (m.state == S::prepare && !m.refusals.empty()) {
    abort("refused: " + m.refusals.front());
  } else if (!m.failures.empty()) {
    abort("transfer failed: " + m.failures.front());
  } else if (m.state == S::prepare || (m.state == S::transfer && m.done < m.bytes)) {
    m.state = S::transfer;
    actions_.push_back(action(K::transfer, m.id));
  } else if (m.state == S::transfer) {
    m.state = S::verify;
    actions_.push_back(action(K::verify, m.id));
    actions_.back().expected = m.expected;
  } else if (m.state == S::verify && !m.mismatches.empty()) {
    abort("checksum mismatch: " + m.mismatches.front());
  } else if (m.state == S::verify && before_commit_ && (failure = before_commit_(m, epoch + 1))) {
    abort("before the switch: " + *failure);
  } else if (m.state == S::verify) {
    m.state = S::commit;
    actions_.push_back(action(K::commit, m.id));
    actions_.back().epoch = epoch + 1;
  } else if (m.state == S::commit) {
    m.state = S::release;
    actions_.push_back(action(K::release, m.id));
  } else if (m.state == S::release) {
    m.state = S::committed;
  }
}

void MigrationCoordinator::after_loss(const std::optional<Settled>& settled, std::uint64_t last_id,
                                      const std::string& why) {
  planning_ = false;
  next_id_ = std::max(next_id_, last_id + 1);
  actions_.clear();
  if (settled && (!migration_ || migration_->id != settled->id)) {
    // The coordinator that started it was lost: the record is rebuilt from this rank's part.
    MigrationRecord& m = migration_.emplace();
    m.id = settled->id;
    m.moves = settled->moves;
    m.why = "a lost coordinator's";
    m.bytes = sent_bytes(m.moves);
    m.expected.assign(m.moves.size(), 0);
  }
  if (!migration_ || !migration_->active()) return;
  MigrationRecord& m = *migration_;
  if (settled && settled->committed) {
    m.state = MigrationState::committed;
    m.done = m.bytes;
    spdlog::warn("migration {} committed on every survivor ({})", m.id, why);
  } else {
    m.state = MigrationState::aborted;
    m.error = fmt::format("{}: rolled back on every survivor, nothing switched", why);
    spdlog::warn("migration {} aborted: {}", m.id, m.error);
  }
}

void MigrationCoordinator::absorb(std::span<const StageReport> reports) {
  if (!migration_) return;
  MigrationRecord& m = *migration_;
  m.done = 0;
  double slowest_send = 0;
  for (std::size_t r = 0; r < reports.size(); ++r) {
    const StageReport& rep = reports[r];
    slowest_send = std::max(slowest_send, rep.send_seconds);
    m.done += rep.sent_bytes;
    if (rep.refused) m.refusals.push_back(*rep.refused);
    if (rep.failed) m.failures.push_back(*rep.failed);
    for (const auto& [move, sum] : rep.checksums) m.expected.at(move) = sum;
    for (std::size_t i : rep.bad_moves)
      m.mismatches.push_back(
          fmt::format("layer {} expert {} on rank {}", numbers_.model(m.moves.at(i).layer), m.moves.at(i).expert, r));
  }
  m.transfer_seconds += slowest_send;
}

void MigrationCoordinator::note_step(double wall_ms) {
  if (migration_ && migration_->active()) {
    migration_->step_ms_during.add(wall_ms);
    return;
  }
  steady_step_ms_.push_back(wall_ms);
  if (steady_step_ms_.size() > kSteadySteps) steady_step_ms_.pop_front();
}

}  // namespace moed::runtime
