// The moed daemon on one rank: start-up (islands, placement, weights,
// transport, workload) checked on every rank before any step, then the step
// loop driven by rank 0, the coordinator, then the report.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "comm/control_channel.h"
#include "comm/fencing_lease.h"
#include "runtime/join/join_listener.h"
#include "comm/mpi/mpi_bootstrap.h"
#include "comm/mpi/mpi_session.h"
#include "comm/survivor_agreement.h"
#include "comm/transport.h"
#include "placement/placement.h"
#include "placement/topology.h"
#include "routing/routing_stats.h"
#include "runtime/control/admin_server.h"
#include "runtime/config/config.h"
#include "runtime/control/control_plane.h"
#include "runtime/engine/engine.h"
#include "runtime/control/fault_injection.h"
#include "runtime/observe/http/http_server.h"
#include "runtime/ingress/front_door.h"
#include "runtime/daemon/output_dump.h"
#include "runtime/observe/report.h"
#include "runtime/observe/snapshot.h"
#include "runtime/trace/trace_selector.h"
#include "runtime/trace/tracer.h"
#include "runtime/weights/expert_store.h"
#include "runtime/workload/workload.h"

namespace moed::runtime {

struct ServeOptions {
  std::string dump_output;  // --dump-output
  std::string report_json;  // --report-json
};

class Daemon {
 public:
  // What start-up gives: the daemon, or, when start-up failed on any rank
  // (each failing rank has logged why), none and the worst exit code.
  struct Started {
    std::unique_ptr<Daemon> daemon;
    int exit_code = 0;
  };
  // Start-up on every rank, in rounds that every rank checks together
  // (runtime/daemon/start_up.cc).
  static Started start(const Config& config, const ServeOptions& options, comm::MpiSession& mpi);
  // `moed --join HOST:PORT`: a process started after the job, outside MPI,
  // reaches world rank 0's join listener ([comm].join_listen), takes a join
  // slot and starts as a spare (holding no expert) that rank 0 admits at
  // once; wait_to_join() then serves from the epoch that admits it.
  // Throws (Usage: refused, with the listener's reason) when it cannot.
  static std::unique_ptr<Daemon> join(const Config& config, const ServeOptions& options, const std::string& listener);
  ~Daemon();

  // Serves step `step` unless it is past the configured steps or the
  // coordinator says stop (returns false then).
  // `reduced`, if given, receives the step's figures over all ranks (rank 0).
  bool serve_step(std::uint64_t step, StepRecord* reduced = nullptr);
  // Rank 0: finishes the output dump, prints the summary, writes the JSON report
  // (and, with [stats].file, the statistics once more).
  void finish();
  // Gathers every rank's routing statistics on rank 0 and writes [stats].file.
  void write_stats(bool last);  // last: the write at exit
  // The step after `step`: the next, or, once the survivors of a loss have
  // agreed, the one they go on from together.
  std::uint64_t next_step(std::uint64_t step);
  // This rank went on without a lost peer (or the job has spares, which
  // never reach MPI_Finalize with the others): it must leave without
  // MPI_Finalize, which would wait for that peer.
  bool outlived_a_peer() const {
    return epoch_served_ > 0 || (world_topology_ && serving_ranks_ < world_topology_->ranks());
  }
  // Before leaving without MPI_Finalize: the members meet once more (every
  // rank hears from every other), so that none leaves while another may not
  // yet have read its last messages (the stop among them): a process that
  // exits may reset its connections, and what they held unread is lost.
  // A peer lost meanwhile ends the meeting early; this rank leaves all the same.
  void meet_before_leaving();
  // This rank's world rank (a joiner's is its join slot).
  int world_rank() const { return transport_ ? transport_->world_rank(transport_->rank()) : rank_; }
  // A spare ([comm].spares): this rank serves nothing until it is admitted.
  bool spare() const { return agreement_ && agreement_->spare(); }
  // A spare waits, holding no expert, until the survivors of a loss admit
  // it, then joins them (true: serve from next_step(0)); false when the job
  // ended first (its members all left, or a stop signal).
  bool wait_to_join();

  const Config& config() const { return config_; }
  comm::ControlChannel& control() { return control_; }
  const placement::Placement& placement() const { return placement_; }
  ControlPlane& control_plane() { return *control_plane_; }
  const ExpertStore& store() const { return *store_; }
  const Engine& engine() const { return *engine_; }
  const Report& report() const { return *report_; }

 private:
  class Startup;  // start-up's steps (start_up.cc)

  Daemon(const Config& config, const ServeOptions& options, comm::MpiSession& mpi);
  // A joiner's: its control collectives run over the transport from the start.
  Daemon(const Config& config, const ServeOptions& options, int world_rank, std::unique_ptr<comm::ControlLink> link);
  const std::byte* in_token_order(std::uint64_t step, const std::vector<std::byte>& rows);
  bool serve_front_door_step(std::uint64_t step, StepRecord* reduced);
  // Every rank: the request ids the boundary before `step` said to follow
  // join the trace selector (or, already served, are answered as such).
  void follow_requests(std::uint64_t step);
  void after_step(std::uint64_t step, std::uint64_t served, std::chrono::steady_clock::time_point started,
                  StepRecord rec, StepRecord* reduced);
  bool serve_front_door_turn(std::uint64_t step, StepRecord* reduced);
  // [metrics].listen's HTTP endpoint, on rank 0: at start, and on the
  // survivors' new rank 0 when world rank 0 was lost.
  void open_metrics_endpoint();
  // [ingress].key_file's key, which network clients and joiners prove (a
  // Usage error naming the key when the file is unusable).
  wire::Key cluster_key() const;
  // [workload].kind = "ingress": this rank's front door (at start, or when a spare joins).
  void open_front_door(int world_rank, int world_ranks);

  // Elastic serving ([comm].elastic; runtime/daemon/elastic.cc).
  // At start: the survivors' agreement over the transport's peer messages,
  // polled from the transport's waits.
  void watch_for_losses(const comm::View& view, bool spare);
  // Polls the agreement, and throws PeersUnreachable (naming no rank) once
  // one began, or decided an epoch this rank has not gone on with.
  void throw_if_loss_under_way();
  // A rank the others left out exits here, before it answers anything.
  void leave_if_fenced();
  // After a lost peer cut step `step` short (`suspects`: who this rank
  // found unreachable) or another rank said so: the agreement, then the
  // survivors' placement, orphans loaded, the engine rebuilt over them.
  void go_on_without(const std::vector<int>& suspects, std::uint64_t step,
                     std::chrono::steady_clock::time_point cut_short);
  // go_on_without, again after each loss during the rebuild.
  void go_on_after_losses(std::vector<int> suspects, std::uint64_t step,
                          std::chrono::steady_clock::time_point cut_short);
  // Once this rank has gone on as a member of `view` (Transport::continue_with):
  // the ranks lost dropped, the spares admitted taken in, the orphans
  // loaded, the engine rebuilt over the members (collective over them).
  void go_on_as(const comm::View& view, std::uint64_t step, std::chrono::steady_clock::time_point cut_short);
  // Rank 0 tells the spares that joined what they take up (the placement,
  // its world ranks, the router biases); collective over the new members.
  // A joiner is the one member without an engine yet.
  void share_state_with_joiners();
  // Rank 0: up to `wanted` spares that wait (neither admitted nor lost),
  // and the beginning of their admission (after a loss, or moectl admit).
  std::vector<int> waiting_spares(std::size_t wanted) const;
  // Rank 0, at a turn's boundary: answers joiners, and admits spares (moectl
  // admit, in place of the lost, joiners) once the epoch has settled.
  void admit_at_boundary();
  void admit(const std::vector<int>& spares, const char* why);

  // Join slots ([comm].join_slots; runtime/daemon/join.cc). The listener
  // runs on the members' rank 0: at start, and on the survivors' new rank 0.
  void open_join_listener();
  // Every member, at the boundary that carries a joiner: reaches it, learns
  // its host and island, and agrees that all reached it.
  void reach_joiner(const JoinerArrival& arrival);
  // Rank 0, after that boundary: answers each joiner (the job as it stands
  // now, or why not); the caller then admits those every member reached.
  void welcome_joiners();

  const Config& config_;
  ServeOptions options_;
  int rank_;
  comm::ControlChannel control_;
  // The transport's; outlives it. Made with the transport, not here: its
  // communicator's duplication is collective, and a rank started in
  // another mode (--print-topology) must first be told so by agree_on_command.
  std::optional<comm::MpiBootstrap> bootstrap_;
  std::unique_ptr<comm::Bootstrap> join_bootstrap_;  // a joiner's (runtime/join/join_bootstrap.h), in place of MPI's
  std::optional<Fault> fault_;
  std::optional<placement::Topology> topology_;        // over the ranks serving now
  std::optional<placement::Topology> world_topology_;  // over every rank of the job, spares included
  int serving_ranks_ = 1;                              // the job's ranks less [comm].spares
  std::vector<char> present_;                          // by world rank: a process holds it (launched, or joined since)
  std::vector<std::string> world_hosts_;               // each world rank's host ("" for a slot not yet joined)
  std::vector<int> serving_ranks() const;              // 0 .. serving_ranks_ - 1: who serves at start
  placement::Placement placement_;
  std::string start_placement_;  // as the report describes it
  std::uint64_t start_epoch_ = 0;
  std::unique_ptr<comm::Transport> transport_;
  std::optional<ExpertStore> store_;
  std::unique_ptr<Workload> workload_;
  std::unique_ptr<OutputDump> dump_;  // rank 0, with --dump-output
  std::unique_ptr<Engine> engine_;
  std::unique_ptr<Report> report_;
  std::optional<routing::RoutingStats> stats_;  // with [stats].file or [admin].dir
  std::uint64_t stats_written_at_ = 0;            // steps seen at the last write
  std::unique_ptr<Snapshot> snapshot_;  // what this rank shows; outlives its readers below
  std::unique_ptr<ControlPlane> control_plane_;
  std::unique_ptr<admin::AdminServer> admin_;     // with [admin].dir
  std::unique_ptr<http::Server> http_;            // rank 0, with [metrics].listen
  std::optional<trace::TraceSelector> trace_selector_;  // which requests are traced (alike on every rank)
  std::unique_ptr<trace::Tracer> tracer_;               // rank 0: the traces, for moectl trace
  std::string islands_source_;
  std::vector<float> hidden_;  // the local tokens' final hidden states of the last step
  std::vector<std::byte> reordered_;  // rank 0: a shuffled step's rows in token order
  std::unique_ptr<ingress::FrontDoor> front_door_;  // [workload].kind = "ingress"
  std::vector<ingress::LayerBatch> batches_;        // the front door's rows of this step, per layer
  std::uint64_t served_ = 0;                        // front door: steps that had work
  int idle_turns_ = 0;                              // front door: turns in a row without work anywhere
  int local_ranks_ = 1;                             // ranks on this host (the memory check's share)
  std::unique_ptr<comm::SurvivorAgreement> agreement_;  // [comm].elastic
  std::optional<comm::FencingLease> lease_;            // [comm].elastic: may this rank answer a step's outputs
  std::uint64_t epoch_served_ = 0;                  // the survivors' epoch this rank serves in
  // Every member has finished going on as epoch_served_ (a turn's counts
  // came from all): rank 0 begins no admission before, or a member still
  // in its last collective of the rebuild leaves it half done.
  bool epoch_settled_ = true;
  std::size_t spares_for_lost_ = 0;                 // rank 0: spares to admit in place of the lost, once settled
  std::vector<int> placement_world_;                // the world rank of each of placement_'s ranks
  bool batches_pending_ = false;                    // batches_ taken but not answered: a loss cut their step short
  std::vector<std::vector<float>> batch_inputs_;    // elastic: batches_' inputs until answered (served again from them)
  std::optional<std::uint64_t> resume_at_;          // the step the survivors go on from
  nlohmann::json losses_ = nlohmann::json::array(); // what status shows of each loss or join (the last kKeptLosses)
  int ranks_lost_ = 0, ranks_joined_ = 0;           // since start
  std::vector<double> joined_biases_;               // a spare that joins: rank 0's router biases
  std::string command_;                              // what every rank runs (command_summary): a joiner's must match
  std::unique_ptr<join::JoinListener> join_listener_;  // the members' rank 0, with [comm].join_slots
  std::vector<std::pair<int, bool>> reached_;       // rank 0: joiners of this boundary, and whether all reached them
};

// moed's main loop: start, serve every configured step, finish. Returns the
// exit code; errors during steps are thrown (the caller aborts the job, since
// peers may be blocked on this rank).
int serve(const Config& config, const ServeOptions& options, comm::MpiSession& mpi);
// `moed --join HOST:PORT` (Daemon::join), outside MPI: serves until the job
// ends, then leaves alone. Errors are thrown (exit codes as anywhere).
[[noreturn]] void serve_joined(const Config& config, const ServeOptions& options, const std::string& listener);

// Each rank's exit code, for a launcher that cannot learn it from mpirun:
// under `mpirun --enable-recovery` (elastic serving) mpirun exits 0 whatever
// its ranks did, measured with Debian's Open MPI 4.1 (docs/elastic.md). With
// MOED_EXIT_STATUS_DIR set (launch/moed-mpirun --elastic sets it), a rank
// that ends writes its code into <dir>/rank-<world rank>. A rank killed, or
// one the survivors left out, writes nothing.
// Best effort: a directory that cannot be written is reported on stderr
// (runtime/daemon/exit_status.cc).
void note_exit_status(int world_rank, int code);

// `moed --print-topology`: every rank reads its host with hwloc; rank 0
// prints the islands found (and where from) and every host's GPUs.
int print_topology(const Config& config, comm::MpiSession& mpi);

}  // namespace moed::runtime
