#include "runtime/daemon/daemon.h"

#include <algorithm>
#include <cstring>
#include <iostream>
#include <limits>

#include "comm/mpi/mpi_control_link.h"
#include "common/clock.h"
#include "common/log.h"
#include "runtime/daemon/start_up.h"
#include "runtime/daemon/stop_signal.h"
#include "runtime/workload/token_order.h"

namespace moed::runtime {

namespace {

// The step's figures over all ranks, on rank 0 (the other ranks keep their
// own record): one gather of every rank's block (runtime/engine/step_record.h).
StepRecord reduce_record(comm::ControlChannel& control, const StepRecord& mine, std::uint64_t step) {
  const std::vector<std::byte> block = encode_step_figures(mine);
  const std::vector<std::byte> all = control.gather(block.data(), block.size(), fmt::format("figures of step {}", step));
  if (control.rank() != 0) return mine;
  return reduce_step_figures(mine, all, control.size(), step);
}

}  // namespace

Daemon::Daemon(const Config& config, const ServeOptions& options, comm::MpiSession& mpi)
    : config_(config),
      options_(options),
      rank_(mpi.rank()),
      control_(comm::mpi_control_link(mpi.world(), std::chrono::milliseconds(config.comm.timeout_ms))) {}

Daemon::Daemon(const Config& config, const ServeOptions& options, int world_rank,
               std::unique_ptr<comm::ControlLink> link)
    : config_(config), options_(options), rank_(world_rank), control_(std::move(link)) {}

Daemon::~Daemon() = default;

// The dump is in token order; a shuffled step serves its tokens out of it.
const std::byte* Daemon::in_token_order(std::uint64_t step, const std::vector<std::byte>& rows) {
  if (config_.workload.order != WorkloadOrder::shuffled) return rows.data();
  const TokenOrder order(std::uint64_t(config_.workload.tokens_per_step), true, std::uint64_t(config_.workload.seed));
  std::vector<std::uint32_t> position;
  order.positions(step, position);
  const std::size_t row_bytes = std::size_t(config_.model.hidden) * sizeof(float);
  reordered_.resize(rows.size());
  for (std::size_t t = 0; t < position.size(); ++t)
    std::memcpy(reordered_.data() + t * row_bytes, rows.data() + position[t] * row_bytes, row_bytes);
  return reordered_.data();
}

bool Daemon::serve_step(std::uint64_t step, StepRecord* reduced) {
  if (front_door_) return serve_front_door_step(step, reduced);
  // Every rank knows the configured end; the control plane may end earlier.
  if (step >= std::uint64_t(config_.workload.steps)) return false;
  const auto started = std::chrono::steady_clock::now();
  if (rank_ == 0) report_->boundary(now_seconds());
  if (!control_plane_->boundary(step)) return false;
  follow_requests(step);
  maybe_inject(fault_, rank_, step);
  StepRecord rec = reduce_record(control_, engine_->run_step(step, hidden_), step);
  if (!options_.dump_output.empty()) {
    std::vector<std::byte> rows = control_.gather(hidden_.data(), hidden_.size() * sizeof(float),
                                                  fmt::format("outputs of step {}", step));
    if (dump_) dump_->append(in_token_order(step, rows), rows.size());
  }
  after_step(step, step, started, std::move(rec), reduced);
  return true;
}

bool Daemon::serve_front_door_step(std::uint64_t step, StepRecord* reduced) {
  if (!agreement_) return serve_front_door_turn(step, reduced);
  const auto started = std::chrono::steady_clock::now();
  try {
    throw_if_loss_under_way();  // a loss another rank noticed: go on without it before this turn
    return serve_front_door_turn(step, reduced);
  } catch (const comm::PeersUnreachable& e) {
    spdlog::warn("step {}: {}", step, e.what());
    go_on_after_losses(e.ranks(), step, started);
    return true;
  }
}

bool Daemon::serve_front_door_turn(std::uint64_t step, StepRecord* reduced) {
  const auto started = std::chrono::steady_clock::now();
  if (rank_ == 0) report_->boundary(now_seconds());
  if (!control_plane_->boundary(step)) return false;
  if (agreement_) admit_at_boundary();
  follow_requests(step);
  // Rows a loss cut short, or whose answers the fencing lease held back,
  // are served again first, alone (elastic serving): a row's bits do not
  // depend on its batch, so they are the bits it would have had, and its
  // client is answered once. The engine writes a layer's outputs over its
  // inputs, so the inputs are kept until the rows are answered.
  if (!batches_pending_) {
    // With no work anywhere, every rank waits a little longer each time (up to
    // [ingress].idle_wait_us), so an idle daemon sleeps instead of spinning.
    const auto idle = std::min<std::int64_t>(config_.ingress.idle_wait_us, std::int64_t(50) << std::min(idle_turns_, 20));
    front_door_->wait_for_work(std::chrono::microseconds(idle));
    front_door_->take(batches_);
    batches_pending_ = true;
    if (agreement_) {
      batch_inputs_.resize(batches_.size());
      for (std::size_t l = 0; l < batches_.size(); ++l) batch_inputs_[l].assign(batches_[l].x.begin(), batches_[l].x.end());
    }
  } else if (agreement_) {
    for (std::size_t l = 0; l < batches_.size(); ++l) batches_[l].x.assign(batch_inputs_[l].begin(), batch_inputs_[l].end());
  }
  std::vector<Engine::LayerRows> rows(batches_.size());
  for (std::size_t l = 0; l < batches_.size(); ++l)
    rows[l] = {batches_[l].x.data(), batches_[l].rows(), batches_[l].request_ids.data(), batches_[l].positions.data()};
  // The step's first collective with every member: the fencing lease runs from here.
  if (lease_) lease_->begin(std::chrono::steady_clock::now());
  const std::vector<std::uint32_t> counts = engine_->agree_layer_counts(rows, step);
  epoch_settled_ = true;  // every member sent its counts: none is still rebuilding
  if (std::all_of(counts.begin(), counts.end(), [](std::uint32_t n) { return n == 0; })) {
    batches_pending_ = false;
    ++idle_turns_;
    snapshot_->note_idle_turn();
    return true;
  }
  idle_turns_ = 0;
  maybe_inject(fault_, rank_, served_);
  StepRecord rec = engine_->run_layers(step, rows, counts);
  if (agreement_) leave_if_fenced();  // a rank the others left out answers nothing (docs/elastic.md)
  if (!lease_ || lease_->holds(std::chrono::steady_clock::now())) {
    front_door_->complete(batches_);
    batches_pending_ = false;
  } else {
    // Past the lease the others may have left this rank out: its rows are
    // served again at the next turn, whose collectives prove it a member.
    spdlog::warn("step {}: this rank's step took {} ms, past the fencing lease ([comm].lease_ms, {} ms): its "
                 "answers wait for the next turn", step, lease_->held(std::chrono::steady_clock::now()).count(),
                 lease_->length().count());
    snapshot_->note_lease_expired();
  }
  rec = reduce_record(control_, rec, step);
  after_step(step, served_++, started, std::move(rec), reduced);
  return true;
}

// Rank 0's figures, the snapshot and the statistics, after a step with work.
// `served` counts the steps with work (the warm-up is the first of them).
void Daemon::after_step(std::uint64_t step, std::uint64_t served, std::chrono::steady_clock::time_point started,
                        StepRecord rec, StepRecord* reduced) {
  Summary summary;
  if (tracer_) tracer_->absorb(rec.trace);
  if (rank_ == 0) {
    report_->add_step(served, rec);
    if (config_.log.per_step) spdlog::info("{}", report_->step_line(step, rec));
    summary = report_->summary();
    if (served >= std::uint64_t(config_.workload.warmup_steps)) snapshot_->record_loads(rec.expert_load);
  }
  control_plane_->publish(step, rank_ == 0 && summary.measured_steps ? &summary : nullptr,
                         std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - started).count());
  if (stats_) {
    // The biases go into the statistics file (rank 0's copy is the one written).
    if (rank_ == 0 && config_.router.bias_gamma > 0) stats_->set_router_bias(engine_->router_biases());
    stats_->end_step();
    if (!config_.stats.file.empty() && stats_->steps() % std::uint64_t(config_.stats.every_steps) == 0)
      write_stats(false);
  }
  if (reduced) *reduced = std::move(rec);
}

void Daemon::follow_requests(std::uint64_t step) {
  for (std::uint64_t id : control_plane_->follow_now()) {
    // A built-in workload knows when each request is served: one whose last
    // position is behind us is answered at once (every rank decides alike).
    if (workload_) {
      const std::uint64_t last = last_step_of_request(id, std::uint64_t(config_.workload.tokens_per_step),
                                                      std::uint64_t(config_.workload.positions_per_request));
      if (last < step) {
        if (tracer_) tracer_->note_too_late(id, last, step);
        if (rank_ == 0) spdlog::info("not tracing request {}: served by step {}, before step {}", id, last, step);
        continue;
      }
    }
    trace_selector_->follow(id);
    if (rank_ == 0) spdlog::info("tracing request {} from this step on (moectl trace --follow)", id);
  }
}

void Daemon::write_stats(bool last) {
  const std::string what = fmt::format("routing statistics after {} steps", stats_->steps());
  std::optional<routing::RoutingStats> merged = control_plane_->gather_stats(what);
  stats_written_at_ = stats_->steps();
  if (rank_ == 0) control_plane_->save_stats(*merged, last);
}

void Daemon::finish() {
  front_door_.reset();  // answers what is still queued with shutting_down
  control_plane_->finish();
  admin_.reset();  // stop answering before the report
  http_.reset();
  if (stats_ && !config_.stats.file.empty() && stats_->steps() != stats_written_at_) write_stats(true);
  if (rank_ != 0) return;
  report_->boundary(now_seconds());  // the last step's wall time
  if (dump_) dump_->finish();
  if (placement_.epoch() != start_epoch_)
    report_->set_placement(fmt::format("migrated live ({}); started from {}", placement_details(placement_),
                                       start_placement_));
  if (!losses_.empty())  // elastic serving: who went, and what is served now
    report_->set_placement(fmt::format("{} ranks lost and {} joined, the last at step {}: now {}; started from {}",
                                       ranks_lost_, ranks_joined_, losses_.back().value("step", std::uint64_t(0)),
                                       placement_details(placement_), start_placement_));
  report_->print(std::cout);
  std::cout.flush();
  if (!options_.report_json.empty()) report_->write_json(options_.report_json);
  if (const int signal = control_plane_->stopped_by())
    spdlog::warn("moed: stopped by {} after {} steps: drained, report{} written, sockets removed",
                 signal_name(signal), report_->steps_served(), config_.stats.file.empty() ? "" : " and statistics");
}

namespace {

// Serves until the configured steps end or the coordinator stops; then the
// report. A spare (or a joiner) first waits to be admitted.
void serve_until_done(Daemon& d) {
  std::uint64_t step = 0;
  if (d.spare()) step = d.wait_to_join() ? d.next_step(0) : std::numeric_limits<std::uint64_t>::max();
  for (; step != std::numeric_limits<std::uint64_t>::max() && d.serve_step(step); step = d.next_step(step)) {
  }
  d.finish();
}

}  // namespace

int serve(const Config& config, const ServeOptions& options, comm::MpiSession& mpi) {
  install_stop_signals();  // from here on, SIGTERM and SIGINT drain (runtime/daemon/stop_signal.h)
  Daemon::Started started = Daemon::start(config, options, mpi);
  if (!started.daemon) return started.exit_code;
  serve_until_done(*started.daemon);
  if (started.daemon->outlived_a_peer()) {
    started.daemon->meet_before_leaving();
    // MPI_Finalize and the transport's collective teardown would wait for
    // the lost rank (docs/elastic.md): what this rank owes is written.
    spdlog::info("moed: leaving without MPI_Finalize, as a rank of the job was lost");
    note_exit_status(mpi.rank(), 0);
    exit_now(0);
  }
  return 0;
}

void serve_joined(const Config& config, const ServeOptions& options, const std::string& listener) {
  install_stop_signals();
  std::unique_ptr<Daemon> d = Daemon::join(config, options, listener);
  serve_until_done(*d);
  d->meet_before_leaving();
  // Its peers are the job's, not its own: it leaves alone, as after a loss.
  note_exit_status(d->world_rank(), 0);
  exit_now(0);
}

}  // namespace moed::runtime
