// The migration coordinator's decisions, as a pure state machine: admin
// requests and the ranks' stage reports go in, the actions every rank applies
// at the next step boundary come out. No threads, no sockets, no MPI: the
// control plane (runtime/control/control_plane.h) feeds it on rank 0, broadcasts its
// actions, and gathers the reports; the tests drive it directly.
//
// A migration moves through
//   prepare -> transfer (one or more boundaries) -> verify -> commit -> release -> committed
// and ends `aborted` from prepare (a rank refused), transfer (a send failed),
// verify (a checksum differs, or what must survive the switch cannot be
// written) or any stage before commit when the daemon shuts down. Commit and release always finish: once ranks switch placement, the
// switch is never undone halfway.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "common/layer_numbers.h"
#include "common/quantile_histogram.h"
#include "placement/placement.h"
#include "placement/placement_diff.h"
#include "placement/topology.h"

namespace moed::runtime {

using placement::SlotBytes;

enum class MigrationState { prepare, transfer, verify, commit, release, committed, aborted };
std::string_view state_name(MigrationState state);

// One rank's report after a boundary that ran a migration stage.
struct StageReport {
  std::size_t sent_bytes = 0;  // all this rank has sent of the migration so far
  double send_seconds = 0;     // this boundary's time in sending
  std::optional<std::string> refused, failed;
  std::vector<std::pair<std::size_t, std::uint64_t>> checksums;  // (move, source checksum), once all is sent
  std::vector<std::size_t> bad_moves;                            // moves whose landed bytes differ
  bool operator==(const StageReport&) const = default;
};

// What every rank does at a boundary, in the order given.
struct ControlAction {
  enum class Kind { gather_stats, prepare, transfer, verify, commit, release, abort };
  Kind kind = Kind::gather_stats;
  std::uint64_t migration = 0;
  std::vector<placement::Move> moves;   // prepare: the slot moves
  std::vector<std::uint64_t> expected;  // verify: the source checksum of each move
  std::uint64_t epoch = 0;              // commit: the placement's new epoch
  bool operator==(const ControlAction&) const = default;
};
std::string_view kind_name(ControlAction::Kind kind);

// A request's fate: accepted (code empty), or refused with an admin error
// code (runtime/admin/protocol.h) and a message naming why.
struct Verdict {
  std::string_view code;
  std::string message;
  bool ok() const { return code.empty(); }
};

// The running or last migration, as the coordinator sees it.
struct MigrationRecord {
  std::uint64_t id = 0;
  std::vector<placement::Move> moves;
  MigrationState state = MigrationState::prepare;
  std::string why;  // "migrate" or "reoptimize"
  std::size_t bytes = 0, done = 0;
  std::string error;                    // why it aborted
  std::vector<std::uint64_t> expected;  // source checksum per move
  std::vector<std::string> refusals, failures, mismatches;
  double transfer_seconds = 0;  // sum over boundaries of the slowest source's send time
  QuantileHistogram step_ms_before, step_ms_during;  // step wall times, in ms
  bool active() const { return state != MigrationState::committed && state != MigrationState::aborted; }
};

class MigrationCoordinator {
 public:
  // slot_bytes: the bytes one expert slot moves; stats_kept: whether
  // reoptimize has statistics to plan from.
  // `numbers`: the model layer numbers its messages name layers by.
  MigrationCoordinator(SlotBytes slot_bytes, bool stats_kept, LayerNumbers numbers = {});

  // Runs on rank 0 before a commit is decided, with the migration and the
  // epoch it would commit: writes what must survive the switch (the committed
  // placement file). An error aborts the migration before any rank switches.
  using BeforeCommit = std::function<std::optional<std::string>(const MigrationRecord&, std::uint64_t epoch)>;
  void set_before_commit(BeforeCommit hook) { before_commit_ = std::move(hook); }

  // One boundary: begin(), the queued requests in arrival order, then end().
  void begin_boundary();
  Verdict shutdown();
  Verdict drain();
  // Copy (layer, expert) to rank `to` from `from` (default: its first holder).
  // A split expert's shard on `from` moves there whole; with a topology, only
  // within the shards' island.
  Verdict migrate(const placement::Placement& current, int layer, int expert, int to, std::optional<int> from,
                  const placement::Topology* topology = nullptr);
  // Accepted: the ranks gather statistics, and planning runs until
  // plan_ready() or plan_failed(). Only one request may plan at a time.
  Verdict reoptimize();
  Verdict unknown_command(const std::string& cmd);
  // The plan of the accepted reoptimize: starts its migration unless it is a
  // dry run or moves nothing. Returns whether a migration started.
  bool plan_ready(std::vector<placement::Move> moves, bool dry_run);
  void plan_failed();
  // A migration the daemon itself asks for (`why`: "a rank joined"): starts
  // it unless another runs or is planned, the daemon is stopping, or there
  // is nothing to move. Returns whether it started.
  bool rebalance(std::vector<placement::Move> moves, const std::string& why);
  // The actions of this boundary: those the requests asked for, then the
  // running migration's next stage (one started at this boundary waits for
  // its prepare reports). `epoch` is the placement's current epoch.
  std::vector<ControlAction> end_boundary(std::uint64_t epoch);

  // Elastic serving, on the survivors' coordinator (world rank 0's successor
  // if it was lost): a planning reoptimize is given up, and the migration
  // the loss cut short ends as the survivors settled it
  // (runtime/control/migration.h, after_loss). `settled`: this rank's part
  // of it (id, moves, whether it committed), if it had one; `last_id`: the
  // newest migration any survivor prepared, so that ids never repeat.
  struct Settled {
    std::uint64_t id = 0;
    std::vector<placement::Move> moves;
    bool committed = false;
  };
  void after_loss(const std::optional<Settled>& settled, std::uint64_t last_id, const std::string& why);

  // The ranks' reports after a boundary whose actions asked for them (rank order).
  void absorb(std::span<const StageReport> reports);
  // A served step's wall time: before a migration, or during it.
  void note_step(double wall_ms);

  bool stop() const { return stopping_ || (draining_ && !busy()); }
  bool stopping() const { return stopping_; }
  bool draining() const { return draining_; }
  bool planning() const { return planning_; }
  bool busy() const { return planning_ || (migration_ && migration_->active()); }
  const MigrationRecord* migration() const { return migration_ ? &*migration_ : nullptr; }

 private:
  Verdict refuse_if_unavailable() const;
  std::size_t sent_bytes(const std::vector<placement::Move>& moves) const;
  void start(std::vector<placement::Move> moves, const std::string& why);
  void abort(const std::string& why);
  void advance(std::uint64_t epoch);

  SlotBytes slot_bytes_;
  bool stats_kept_;
  LayerNumbers numbers_;
  BeforeCommit before_commit_;
  bool stopping_ = false, draining_ = false, planning_ = false;
  bool busy_at_begin_ = false;
  std::uint64_t running_at_begin_ = 0;  // the migration that may advance at this boundary
  std::optional<MigrationRecord> migration_;
  std::uint64_t next_id_ = 1;
  std::vector<ControlAction> actions_;
  std::deque<double> steady_step_ms_;  // wall times of the last kSteadySteps steps without a migration
  static constexpr std::size_t kSteadySteps = 256;
};

}  // namespace moed::runtime
