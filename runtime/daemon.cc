#include "runtime/daemon.h"

#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <map>

#include "common/error.h"
#include "common/log.h"
#include "kernels/cpu/gemm.h"
#include "launch/launch_env.h"
#include "placement/placement_file.h"

namespace moed::runtime {

namespace {

// Islands from [cluster].ranks_per_island, or one island per host.
placement::Topology discover_islands(const Config& c, comm::ControlChannel& control,
                                     const std::string& host) {
  if (c.cluster.ranks_per_island > 0)
    return placement::Topology::blocks(control.size(), int(c.cluster.ranks_per_island));
  std::vector<std::string> hosts = control.all_gather_strings(host, "host names at start-up");
  std::map<std::string, int> island_of_host;
  std::vector<int> island;
  for (const auto& h : hosts) island.push_back(island_of_host.try_emplace(h, int(island_of_host.size())).first->second);
  return placement::Topology(std::move(island));
}

placement::Placement initial_placement(const Config& c, int ranks) {
  const int L = int(c.model.layers), E = int(c.model.experts);
  placement::Placement p =
      c.placement.file.empty()
          ? placement::make_placement(c.placement.policy, ranks, L, E, std::uint64_t(c.placement.seed))
          : placement::read_placement_file(c.placement.file);
  std::string origin = c.placement.file.empty() ? "[placement].policy" : c.placement.file;
  placement::check_placement_shape(p, ranks, L, E, origin);
  p.validate(origin, int(c.placement.max_slots_per_rank));
  return p;
}

std::string describe_placement(const Config& c, const placement::Placement& p) {
  std::string how = c.placement.file.empty() ? c.placement.policy : "file " + c.placement.file;
  int replicated = 0;
  for (int l = 0; l < p.layers(); ++l)
    for (int e = 0; e < p.experts(); ++e) replicated += p.replicas(l, e).size() > 1;
  return fmt::format("{} (epoch {}, {} replicated experts, at most {} slots per rank)", how,
                     p.epoch(), replicated, p.max_slots_per_rank());
}

// Output files are opened (or checked) before the first step, so that a bad
// path is a start-up error every rank agrees on, not a failure at the end.
void check_output_paths(const ServeOptions& options, int rank, const Config& c,
                        std::unique_ptr<OutputDump>& dump) {
  if (rank != 0) return;
  if (!options.dump_output.empty())
    dump = std::make_unique<OutputDump>(
        options.dump_output, OutputHeader{std::uint64_t(c.model.hidden),
                                          std::uint64_t(c.workload.tokens_per_step),
                                          std::uint64_t(c.workload.steps)});
  if (!options.report_json.empty()) {
    std::string dir = std::filesystem::path(options.report_json).parent_path().string();
    if (::access(dir.empty() ? "." : dir.c_str(), W_OK) != 0)
      MOED_THROW(Usage, "--report-json {}: cannot write into {}: {}", options.report_json,
                 dir.empty() ? "." : dir, std::strerror(errno));
  }
}

// Per-step reduction: times are maxed over ranks, bytes summed.
StepRecord reduce_record(comm::ControlChannel& control, const StepRecord& mine, std::uint64_t step) {
  StepRecord out = mine;
  std::vector<double> times{mine.total, mine.route, mine.plan, mine.dispatch, mine.experts, mine.combine};
  times.insert(times.end(), mine.dispatch_a2a.begin(), mine.dispatch_a2a.end());
  times.insert(times.end(), mine.combine_a2a.begin(), mine.combine_a2a.end());
  control.reduce_max(times.data(), times.size(), fmt::format("figures of step {}", step));
  std::vector<std::uint64_t> sums(mine.bytes_sent.begin(), mine.bytes_sent.end());
  sums.push_back(mine.saturated);
  control.reduce_sum(sums.data(), sums.size(), fmt::format("byte counts of step {}", step));
  out.total = times[0], out.route = times[1], out.plan = times[2];
  out.dispatch = times[3], out.experts = times[4], out.combine = times[5];
  const std::size_t L = mine.dispatch_a2a.size();
  out.dispatch_a2a.assign(times.begin() + 6, times.begin() + 6 + L);
  out.combine_a2a.assign(times.begin() + 6 + L, times.end());
  for (int c = 0; c < placement::kLinkClasses; ++c) out.bytes_sent[c] = sums[c];
  out.saturated = sums[placement::kLinkClasses];
  return out;
}

}  // namespace

Daemon::Daemon(const Config& config, const ServeOptions& options, comm::MpiSession& mpi)
    : config_(config),
      options_(options),
      rank_(mpi.rank()),
      control_(mpi.world(), std::chrono::milliseconds(config.comm.timeout_ms)) {}

Daemon::~Daemon() = default;

std::unique_ptr<Daemon> Daemon::start(const Config& c, const ServeOptions& options,
                                      comm::MpiSession& mpi, int& exit_code) {
  std::unique_ptr<Daemon> d(new Daemon(c, options, mpi));
  launch::LaunchInfo where = launch::detect_launch();
  kernels::set_blas_threads(int(c.experts.blas_threads));

  // Every rank tries, then all agree before anyone serves.
  exit_code = 0;
  try {
    d->fault_ = fault_from_env();
    d->topology_.emplace(discover_islands(c, d->control_, where.host));
    d->placement_ = initial_placement(c, mpi.size());
    d->transport_ = comm::create_transport(c.comm, mpi.world());
    d->store_.emplace(ExpertStore::load(c, d->placement_, d->rank_));
    d->workload_ = make_workload(c, d->store_->layer(0).gate.data());
    check_output_paths(options, d->rank_, c, d->dump_);
  } catch (const Error& e) {
    spdlog::error("start-up failed: {}", e.describe());
    exit_code = e.exit_code();
  } catch (const std::exception& e) {
    spdlog::error("start-up failed: {}", e.what());
    exit_code = 1;
  }
  exit_code = d->control_.all_max(exit_code, "start-up status");
  if (exit_code != 0) {
    if (d->rank_ == 0) spdlog::error("not serving: start-up failed (see the errors above)");
    return nullptr;
  }

  d->engine_ = std::make_unique<Engine>(c, *d->transport_, *d->topology_, d->placement_,
                                        *d->store_, *d->workload_);
  if (!c.stats.file.empty()) {
    const std::size_t per_rank = std::size_t((c.stats.sample_tokens + mpi.size() - 1) / mpi.size());
    d->stats_.emplace(int(c.model.layers), int(c.model.experts), c.stats.half_life_steps, per_rank,
                      int(std::max(c.model.top_k, c.router.max_k)));
    d->engine_->record_stats_into(&*d->stats_);
  }
  // No GPU is used yet: the CPU path serves (the CUDA kernels are not wired in).
  spdlog::info("on {} (local rank {} of {}, launched by {}; {}), island {}, {} expert slots ({:.1f} MB), "
               "tokens [{}, {}) of each step",
               where.host, where.local_rank, where.local_size, where.launcher,
               launch::describe_binding(where, launch::probe_binding(/*gpu_count=*/0)),
               d->topology_->island_of(d->rank_), d->store_->slots(),
               double(d->store_->expert_bytes()) / 1e6, d->engine_->first_token(),
               d->engine_->first_token() + d->engine_->local_tokens());

  RunInfo info{mpi.size(), d->topology_->islands(), d->store_->shape(),
               std::uint64_t(c.workload.tokens_per_step), std::uint64_t(c.workload.steps),
               std::uint64_t(c.workload.warmup_steps), d->transport_->name(),
               d->workload_->describe(), describe_placement(c, d->placement_),
               kernels::blas_description(), d->topology_->describe()};
  d->report_ = std::make_unique<Report>(info, int(c.metrics.load_window_steps));
  if (d->rank_ == 0) {
    spdlog::info("serving {} with {} ranks ({}), {}", info.shape.describe(), info.ranks,
                 info.topology, info.placement);
    spdlog::info("workload: {}", info.workload);
  }
  return d;
}

bool Daemon::serve_step(std::uint64_t step, StepRecord* reduced) {
  StepCommand cmd{step, step < std::uint64_t(config_.workload.steps) ? 0u : 1u};
  control_.broadcast(&cmd, sizeof cmd, fmt::format("command of step {}", step));
  if (cmd.op == 1) return false;
  maybe_inject(fault_, rank_, cmd.step);
  StepRecord rec = reduce_record(control_, engine_->run_step(cmd.step, hidden_), cmd.step);
  if (!options_.dump_output.empty()) {
    std::vector<std::byte> rows = control_.gather(hidden_.data(), hidden_.size() * sizeof(float),
                                                  fmt::format("outputs of step {}", cmd.step));
    if (dump_) dump_->append(rows.data(), rows.size());
  }
  if (rank_ == 0) {
    report_->add_step(cmd.step, rec);
    if (config_.log.per_step) spdlog::info("{}", report_->step_line(cmd.step, rec));
  }
  if (stats_) {
    stats_->end_step();
    if (stats_->steps() % std::uint64_t(config_.stats.every_steps) == 0) write_stats();
  }
  if (reduced) *reduced = std::move(rec);
  return true;
}

void Daemon::write_stats() {
  const std::string what = fmt::format("routing statistics after {} steps", stats_->steps());
  placement::RoutingStats merged = *stats_;
  merged.normalize();
  control_.reduce_sum(merged.raw().data(), merged.raw().size(), what);
  std::vector<std::uint32_t> mine = stats_->sample_cells();
  std::vector<std::byte> all = control_.gather(mine.data(), mine.size() * sizeof(std::uint32_t), what);
  stats_written_at_ = stats_->steps();
  if (rank_ != 0) return;
  // Rank 0's own paths are in `merged` already; the others' follow, in rank order.
  std::span<const std::uint32_t> cells(reinterpret_cast<const std::uint32_t*>(all.data()),
                                       all.size() / sizeof(std::uint32_t));
  merged.append_sample_cells(cells.subspan(mine.size()));
  placement::write_stats_file(merged, config_.stats.file);
  spdlog::info("wrote {} ({} steps, {} sampled tokens)", config_.stats.file, merged.steps(),
               merged.sample_size());
}

void Daemon::finish() {
  if (stats_ && stats_->steps() != stats_written_at_) write_stats();
  if (rank_ != 0) return;
  if (dump_) dump_->finish();
  report_->print(std::cout);
  std::cout.flush();
  if (!options_.report_json.empty()) report_->write_json(options_.report_json);
}

int serve(const Config& config, const ServeOptions& options, comm::MpiSession& mpi) {
  int exit_code = 0;
  std::unique_ptr<Daemon> daemon = Daemon::start(config, options, mpi, exit_code);
  if (!daemon) return exit_code;
  for (std::uint64_t step = 0; daemon->serve_step(step); ++step) {
  }
  daemon->finish();
  return 0;
}

}  // namespace moed::runtime
