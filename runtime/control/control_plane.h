// The control plane: decisions taken at step boundaries, in the same order on
// every rank.
//
// Rank 0, the coordinator, queues the admin socket's control requests
// (reoptimize, migrate, stats, drain, shutdown) and, at each boundary, turns
// them and the progress of the running migration into a list of actions (the
// decisions are runtime/control/migration_coordinator.h's, a pure state machine). The
// list is broadcast; every rank applies it in order (the collective ones, a
// statistics gather or an RMA window, together). A migration's ranks then
// report to rank 0, which decides the next stage at the next boundary. So
// nothing a client does reaches the step loop between boundaries, and a slow
// decision (the optimiser) runs on a thread of rank 0's own while steps go on.
//
// Every rank also writes what it decided into its published snapshot
// (runtime/observe/snapshot.h: status, metrics, placement, the migration's
// progress, the merged statistics), which the admin socket's and the HTTP
// endpoint's threads answer from.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <future>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/write_retry.h"
#include "placement/placement.h"
#include "placement/topology.h"
#include "routing/routing_stats.h"
#include "runtime/config/config.h"
#include "runtime/control/admin_server.h"
#include "runtime/control/control_messages.h"
#include "runtime/control/migration.h"
#include "runtime/control/migration_coordinator.h"
#include "runtime/control/reoptimizer.h"
#include "runtime/weights/expert_store.h"

namespace moed::comm {
class ControlChannel;
class Transport;
}  // namespace moed::comm

namespace moed::runtime {

class Snapshot;  // runtime/observe/snapshot.h
struct Summary;  // runtime/observe/report.h

// What the control plane works on; owned by the daemon.
struct ControlContext {
  const Config& config;
  int rank, ranks;
  comm::ControlChannel& control;
  comm::Transport& transport;
  ExpertStore& store;
  placement::Placement& placement;
  const placement::Topology& topology;
  routing::RoutingStats* stats;  // null when none is kept
  Snapshot& snapshot;            // where the decisions show
  // The first stop signal received, or 0, and its name for the log: the
  // daemon owns the handlers (runtime/daemon/stop_signal.h). Null: none.
  int (*stop_signal)() = nullptr;
  const char* (*signal_name)(int) = nullptr;
};

class ControlPlane {
 public:
  explicit ControlPlane(ControlContext context);
  ~ControlPlane();

  // The admin socket's handler of control requests (any thread; rank 0).
  void submit(admin::Request request, admin::Reply reply);

  // At the boundary before step `step`, on every rank (collective). Returns
  // false when the daemon must stop (shutdown, or a drain that has finished).
  bool boundary(std::uint64_t step);
  // After a step: the figures the snapshot shows (rank 0 has the run's
  // summary), and the step's wall time from its boundary on (the migration
  // figures compare the steps during a migration with the steps before it).
  void publish(std::uint64_t step, const Summary* summary, double step_wall_ms);
  // At exit: answers whatever is still waiting.
  void finish();
  // Elastic serving, after a lost rank, before Transport::continue_with: a
  // running migration's window goes (locally: the lost rank cannot take
  // part in its teardown), keeping what landed here.
  void abandon_for_loss();
  // After continue_with (collective over the survivors): this rank takes its
  // number among them, and the migration the loss cut short is finished or
  // undone alike on every survivor (after_loss in runtime/control/migration.h);
  // a reoptimize being planned is answered with an error. Returns what
  // happened to the migration, for the loss's alert ("" when none ran).
  std::string settle_after_loss(const std::vector<int>& lost_world);
  // After the daemon has renumbered the placement over the survivors: shows it.
  void placement_renumbered() { publish_placement(); }
  // Rank 0, after spares joined as `ranks` (holding nothing): from the next
  // boundary at which no other migration runs, a migration gives each its
  // share of the slots (placement::moves_to_newcomers).
  void give_load_to(std::vector<int> ranks) { newcomers_ = std::move(ranks); }
  // Rank 0, elastic serving with spares: `waiting(n)` returns up to n world
  // ranks of spares that wait (neither admitted nor lost), for `admit`.
  void on_admit(std::function<std::vector<int>(int)> waiting) { spares_waiting_ = std::move(waiting); }
  // Join slots ([comm].join_slots). Rank 0: `take()` gives the joiners
  // whose address came, taken at a boundary at which no migration runs;
  // every rank: `reach(arrival)` runs as the boundary that carries it is applied.
  void on_joiners(std::function<std::vector<JoinerArrival>()> take, std::function<void(const JoinerArrival&)> reach) {
    take_joiners_ = std::move(take);
    reach_joiner_ = std::move(reach);
  }
  // Rank 0, after a boundary: the spares an `admit` request asked for
  // (the daemon begins their admission), each returned once.
  std::vector<int> take_admission() { return std::exchange(admitting_, {}); }
  // The request ids the last boundary asked every rank to trace (moectl trace --follow).
  const std::vector<std::uint64_t>& follow_now() const { return follow_now_; }
  // Rank 0: the signal (SIGTERM, SIGINT) that stopped the daemon, or 0.
  int stopped_by() const { return stopped_by_; }

  // Gathers every rank's statistics on rank 0 (collective); rank 0 gets the
  // merged copy (the snapshot shares it), the others an empty optional.
  std::optional<routing::RoutingStats> gather_stats(const std::string& what);
  // Rank 0: writes the merged statistics to [stats].file. A failure is
  // logged, shown in status alerts and metrics, and retried with backoff;
  // it never stops serving. `last`: the write at exit (tried even while
  // backing off).
  void save_stats(const routing::RoutingStats& merged, bool last);

 private:
  using json = nlohmann::json;

  BoundaryActions decide();                    // rank 0
  void apply(const BoundaryActions& actions);  // every rank
  StageReport my_report() const;               // every rank, while a migration runs
  void finish_reoptimize();
  void commit_placement();
  json migration_json() const;
  void publish_migration();
  void publish_placement();
  void reply_all_pending(std::string_view code, const std::string& message);

  ControlContext c_;
  LayerNumbers numbers_;  // the model layer numbers answers name layers by
  // Requests from the socket thread, taken at the next boundary (rank 0).
  std::mutex queue_mu_;
  std::deque<std::pair<admin::Request, admin::Reply>> queue_;
  // Rank 0: the coordinator's decisions, and the re-optimisation it plans.
  MigrationCoordinator coordinator_;
  int stopped_by_ = 0;
  std::vector<std::uint64_t> follow_asked_, follow_now_;  // rank 0: asked since the last boundary; every rank: applied
  WriteRetry stats_writes_;
  std::uint64_t committed_write_failures_ = 0;
  std::optional<std::pair<admin::Request, admin::Reply>> reoptimize_;  // waiting for its plan
  std::future<ReoptimizePlan> optimizing_;  // the plan, made on a thread of rank 0's own
  std::future<ReoptimizePlan> given_up_;    // a plan a loss made stale, let finish and dropped
  // This rank's side of the running migration.
  MigrationWindows windows_;
  std::unique_ptr<MigrationTransfer> transfer_;
  std::optional<std::string> refusal_, failure_;
  std::vector<std::size_t> bad_checksums_;
  bool verified_ = false, switched_ = false;  // this rank's part of transfer_: landed bytes checked; committed
  std::uint64_t last_migration_ = 0;          // the newest migration this rank prepared
  std::vector<int> newcomers_;                 // rank 0: ranks that joined and wait for their slots
  std::function<std::vector<int>(int)> spares_waiting_;  // rank 0: see on_admit
  std::function<std::vector<JoinerArrival>()> take_joiners_;  // see on_joiners
  std::function<void(const JoinerArrival&)> reach_joiner_;
  std::vector<int> admitting_;                            // rank 0: spares `admit` asked for, for the daemon
  double send_seconds_ = 0;  // this boundary's time in MigrationTransfer::send
  MigrationFaults faults_;
};

}  // namespace moed::runtime
