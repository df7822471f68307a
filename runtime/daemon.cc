#include "runtime/daemon.h"

#include <iostream>
#include <map>
#include <memory>
#include <optional>

#include "comm/control_channel.h"
#include "comm/transport.h"
#include "common/error.h"
#include "common/log.h"
#include "kernels/cpu/gemm.h"
#include "launch/launch_env.h"
#include "placement/placement_file.h"
#include "runtime/engine.h"
#include "runtime/output_dump.h"
#include "runtime/report.h"

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

// Everything a rank builds before the first step.
struct Setup {
  std::optional<placement::Topology> topology;
  placement::Placement placement;
  std::unique_ptr<comm::Transport> transport;
  std::optional<ExpertStore> store;
  std::unique_ptr<Workload> workload;
};

// The step's command from the coordinator; later commands (re-optimise,
// migrate, drain) join here, applied by every rank at the same boundary.
struct StepCommand {
  std::uint64_t step = 0;
  std::uint32_t op = 0;  // 0: serve the step, 1: stop
};

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

int serve(const Config& c, const ServeOptions& options, comm::MpiSession& mpi) {
  const int rank = mpi.rank(), ranks = mpi.size();
  comm::ControlChannel control(mpi.world(), std::chrono::milliseconds(c.comm.timeout_ms));
  launch::LaunchInfo where = launch::detect_launch();
  kernels::set_blas_threads(int(c.experts.blas_threads));

  // Start-up: every rank tries, then all agree before anyone serves.
  Setup s;
  int exit_code = 0;
  try {
    s.topology = discover_islands(c, control, where.host);
    s.placement = initial_placement(c, ranks);
    s.transport = comm::create_transport(c.comm, mpi.world());
    s.store = ExpertStore::load(c, s.placement, rank);
    s.workload = make_workload(c, s.store->layer(0).gate.data());
  } catch (const Error& e) {
    spdlog::error("start-up failed: {}", e.describe());
    exit_code = e.exit_code();
  } catch (const std::exception& e) {
    spdlog::error("start-up failed: {}", e.what());
    exit_code = 1;
  }
  exit_code = control.all_max(exit_code, "start-up status");
  if (exit_code != 0) {
    if (rank == 0) spdlog::error("not serving: start-up failed (see the errors above)");
    return exit_code;
  }

  Engine engine(c, *s.transport, *s.topology, s.placement, *s.store, *s.workload);
  spdlog::info("on {} (local rank {} of {}, launched by {}), island {}, {} expert slots ({:.1f} MB), "
               "tokens [{}, {}) of each step",
               where.host, where.local_rank, where.local_size, where.launcher,
               s.topology->island_of(rank), s.store->slots(), double(s.store->expert_bytes()) / 1e6,
               engine.first_token(), engine.first_token() + engine.local_tokens());

  const ModelShape shape = s.store->shape();
  RunInfo info{ranks, s.topology->islands(), shape, std::uint64_t(c.workload.tokens_per_step),
               std::uint64_t(c.workload.steps), std::uint64_t(c.workload.warmup_steps),
               s.transport->name(), s.workload->describe(), describe_placement(c, s.placement),
               kernels::blas_description(), s.topology->describe()};
  Report report(info, int(c.metrics.load_window_steps));
  std::unique_ptr<OutputDump> dump;
  if (rank == 0) {
    spdlog::info("serving {} with {} ranks ({}), {}", shape.describe(), ranks, info.topology,
                 info.placement);
    spdlog::info("workload: {}", info.workload);
    if (!options.dump_output.empty())
      dump = std::make_unique<OutputDump>(
          options.dump_output,
          OutputHeader{std::uint64_t(shape.hidden), info.tokens_per_step, info.steps});
  }

  std::vector<float> hidden;
  for (std::uint64_t step = 0;; ++step) {
    StepCommand cmd{step, step < info.steps ? 0u : 1u};
    control.broadcast(&cmd, sizeof cmd, fmt::format("command of step {}", step));
    if (cmd.op == 1) break;
    StepRecord rec = reduce_record(control, engine.run_step(cmd.step, hidden), cmd.step);
    if (!options.dump_output.empty()) {
      std::vector<std::byte> rows = control.gather(hidden.data(), hidden.size() * sizeof(float),
                                                   fmt::format("outputs of step {}", cmd.step));
      if (dump) dump->append(rows.data(), rows.size());
    }
    if (rank == 0) {
      report.add_step(cmd.step, rec);
      if (c.log.per_step) spdlog::info("{}", report.step_line(cmd.step, rec));
    }
  }

  if (rank == 0) {
    if (dump) dump->finish();
    report.print(std::cout);
    std::cout.flush();
    if (!options.report_json.empty()) report.write_json(options.report_json);
  }
  return 0;
}

}  // namespace moed::runtime
