#include "runtime/daemon/daemon.h"

#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <functional>
#include <map>
#include <sstream>

#include "comm/idle_backoff.h"
#include "common/clock.h"
#include "common/error.h"
#include "common/listen_address.h"
#include "common/log.h"
#include "kernels/cpu/fixed_order_gemm.h"
#include "kernels/cpu/gemm.h"
#include "launch/launch_env.h"
#include "launch/hwloc_topology.h"
#include "launch/numa_binding.h"
#include "launch/nvlink_islands.h"
#include "launch/rank_topology_codec.h"
#include "launch/topology_description.h"
#include "placement/memory_plan.h"
#include "placement/placement_file.h"
#include "placement/shard_rules.h"
#include "routing/stats_file.h"
#include "runtime/observe/http/dashboard_routes.h"
#include "runtime/config/memory_estimate.h"
#include "runtime/control/snapshot_answer.h"
#include "runtime/daemon/stop_signal.h"
#include "runtime/workload/token_order.h"

namespace moed::runtime {

namespace {

// "0,0,1,1": each rank's island, renumbered densely in order of appearance.
std::vector<int> explicit_islands(const std::string& text, int ranks) {
  std::vector<int> island;
  std::map<long, int> dense;
  std::size_t at = 0;
  while (at <= text.size()) {
    std::size_t comma = std::min(text.find(',', at), text.size());
    std::string item = text.substr(at, comma - at);
    char* end = nullptr;
    long v = std::strtol(item.c_str(), &end, 10);
    if (item.empty() || *end != '\0' || v < 0)
      MOED_THROW(Usage, "[cluster].islands = \"{}\": \"{}\" is not an island number", text, item);
    island.push_back(dense.try_emplace(v, int(dense.size())).first->second);
    at = comma + 1;
  }
  if (int(island.size()) != ranks)
    MOED_THROW(Usage, "[cluster].islands names {} ranks, the job has {}", island.size(), ranks);
  return island;
}

// The first collective of every mode: all ranks must run the same command
// with the same configuration. mpirun's app contexts (`A : B`) make it easy to
// give ranks different flags, and ranks in different modes would otherwise
// wait on each other's different collectives. Returns an exit code (2 when
// the ranks disagree), the same on every rank.
int agree_on_command(comm::ControlChannel& control, const std::string& mode, const Config& c) {
  std::ostringstream effective;
  print_config(effective, c);
  const std::string mine =
      fmt::format("{} with configuration {:016x}", mode, std::hash<std::string>{}(effective.str()));
  const std::vector<std::string> all = control.all_gather_strings(mine, "the command of every rank");
  std::string differing;
  for (std::size_t r = 1; r < all.size(); ++r)
    if (all[r] != all[0]) differing += fmt::format("; rank {} runs {}", r, all[r]);
  if (differing.empty()) return 0;
  if (control.rank() == 0)
    spdlog::error("the ranks were started differently (each rank needs the same flags and config; "
                  "with mpirun app contexts `A : B`, give the flags to each): rank 0 runs {}{}",
                  all[0], differing);
  return 2;
}

// Every rank's view of its host (all-gathered), and the islands: in order,
// [cluster].islands, [cluster].ranks_per_island, hwloc's NVLink islands, host names.
struct FoundIslands {
  std::vector<launch::RankTopology> ranks;
  launch::RankIslands islands;
};

FoundIslands discover_islands(const Config& c, comm::ControlChannel& control,
                              const launch::LaunchInfo& where, const launch::HostTopology& mine) {
  const char* cvd = std::getenv("CUDA_VISIBLE_DEVICES");
  FoundIslands found;
  for (const auto& text : control.all_gather_strings(
           launch::encode_rank_topology({where.host, where.local_rank, mine,
                                         cvd ? std::optional<std::string>(cvd) : std::nullopt}),
           "host topologies at start-up"))
    found.ranks.push_back(launch::decode_rank_topology(text));
  found.islands = launch::rank_islands(found.ranks);
  if (!c.cluster.islands.empty())
    found.islands = {explicit_islands(c.cluster.islands, control.size()), "[cluster].islands"};
  else if (c.cluster.ranks_per_island > 0)
    found.islands = {placement::Topology::blocks(control.size(), int(c.cluster.ranks_per_island)).island_of_ranks(),
                     "[cluster].ranks_per_island"};
  return found;
}

// This rank's host as hwloc sees it (HWLOC_XMLFILE is honoured: tests give
// each emulated host its own). An error is kept, not thrown, so that the rank
// still joins the start-up all-gather before failing.
struct LocalHost {
  std::optional<launch::HwlocTopology> hwloc;
  launch::HostTopology host;
  std::exception_ptr error;
};

LocalHost read_local_host() {
  LocalHost h;
  try {
    h.hwloc.emplace(launch::HwlocTopology::this_machine());
    h.host = launch::read_host_topology(*h.hwloc);
  } catch (...) {
    h.error = std::current_exception();
  }
  return h;
}

// The last committed placement when there is one (a restart resumes it),
// else [placement].file, else the policy.
std::string placement_origin(const Config& c) {
  if (!c.placement.committed.empty() && std::filesystem::exists(c.placement.committed))
    return c.placement.committed;
  return c.placement.file;
}

placement::Placement initial_placement(const Config& c, const placement::Topology& topology) {
  const int ranks = topology.ranks();
  const int L = int(c.model.layers), E = int(c.model.experts);
  const std::string file = placement_origin(c);
  placement::Placement p =
      file.empty() ? placement::make_placement(c.placement.policy, ranks, L, E, std::uint64_t(c.placement.seed))
                   : placement::read_placement_file(file);
  std::string origin = file.empty() ? "[placement].policy" : file;
  placement::check_placement_shape(p, ranks, L, E, origin);
  p.validate(origin, int(c.placement.max_slots_per_rank));
  placement::check_shards(p, int(c.experts.ffn_chunks), topology, origin);
  return p;
}

// Statistics are kept for the stats file and for online re-optimisation.
// Rank 0 resumes them from an existing stats file (the others start empty:
// the sum over ranks is then the file plus what this run sees).
std::optional<routing::RoutingStats> initial_stats(const Config& c, int rank, int ranks) {
  if (c.stats.file.empty() && c.admin.dir.empty()) return std::nullopt;
  const std::size_t per_rank = std::size_t((c.stats.sample_tokens + ranks - 1) / ranks);
  const int max_k = int(std::max(c.model.top_k, c.router.max_k));
  if (rank == 0 && !c.stats.file.empty() && std::filesystem::exists(c.stats.file)) {
    routing::RoutingStats resumed = routing::read_stats_file(c.stats.file);
    if (resumed.layers() != c.model.layers || resumed.experts() != c.model.experts)
      MOED_THROW(Input, "{}: statistics of {} layers x {} experts; [model] has {} x {}", c.stats.file,
                 resumed.layers(), resumed.experts(), c.model.layers, c.model.experts);
    spdlog::info("resuming the statistics of {} ({} steps)", c.stats.file, resumed.steps());
    return resumed;
  }
  return routing::RoutingStats(int(c.model.layers), int(c.model.experts), c.stats.half_life_steps,
                                 per_rank, max_k);
}

// "epoch 0, 2 replicated experts, at most 4 slots per rank" (", 1 split expert" when some are)
std::string placement_details(const placement::Placement& p) {
  int replicated = 0, split = 0;
  for (int l = 0; l < p.layers(); ++l)
    for (int e = 0; e < p.experts(); ++e) {
      split += p.sharded(l, e);
      replicated += p.replicas(l, e).size() > 1 && !p.sharded(l, e);
    }
  return fmt::format("epoch {}, {} replicated experts{}, at most {} slots per rank", p.epoch(), replicated,
                     split ? fmt::format(", {} split expert{}", split, split == 1 ? "" : "s") : "",
                     p.max_slots_per_rank());
}

std::string describe_placement(const Config& c, const placement::Placement& p) {
  const std::string file = placement_origin(c);
  return fmt::format("{} ({})", file.empty() ? c.placement.policy : "file " + file, placement_details(p));
}

// Output files are opened (or checked) before the first step, so that a bad
// path is a start-up error every rank agrees on, not a failure at the end.
void check_output_paths(const ServeOptions& options, int rank, const Config& c,
                        std::unique_ptr<OutputDump>& dump) {
  if (c.workload.kind == "ingress" && !options.dump_output.empty())
    MOED_THROW(Usage, "--dump-output: with [workload].kind = \"ingress\" the outputs go back to the clients");
  if (rank != 0) return;
  if (!options.dump_output.empty())
    dump = std::make_unique<OutputDump>(
        options.dump_output, OutputHeader{std::uint64_t(c.model.hidden),
                                          std::uint64_t(c.workload.tokens_per_step),
                                          std::uint64_t(c.workload.steps)});
  // Files written atomically (a temp file beside them, then a rename) need
  // their folder writable.
  const auto check_dir_of = [](const std::string& path, const std::string& what) {
    if (path.empty()) return;
    const std::string dir = std::filesystem::path(path).parent_path().string();
    if (::access(dir.empty() ? "." : dir.c_str(), W_OK) != 0)
      MOED_THROW(Usage, "{} {}: cannot write into {}: {}", what, path, dir.empty() ? "." : dir,
                 std::strerror(errno));
  };
  check_dir_of(options.report_json, "--report-json");
  check_dir_of(c.stats.file, "[stats].file");
  check_dir_of(c.placement.committed, "[placement].committed");
}

ingress::Limits ingress_limits(const Config& c) {
  ingress::Limits l;
  l.max_clients = int(c.ingress.max_clients);
  l.max_slots = std::uint32_t(c.ingress.max_slots);
  l.max_rows = std::uint32_t(c.ingress.max_rows);
  l.max_tokens_per_step = std::size_t(c.ingress.max_tokens_per_step);
  l.max_wait = std::chrono::microseconds(c.ingress.max_wait_us);
  l.max_client_bytes = std::size_t(c.ingress.max_client_mb) << 20;
  return l;
}

std::string describe_workload(const Config& c, const Workload* w) {
  if (w) return w->describe();
  return fmt::format("front door at {} (at most {} rows per layer per step per rank, {} us to fill)", c.ingress.dir,
                     c.ingress.max_tokens_per_step, c.ingress.max_wait_us);
}

// The fixed-order GEMM kernel [experts].isa names (auto: the widest here).
void choose_gemm_isa(const Config& c) {
  if (c.experts.isa == "auto") return kernels::set_gemm_isa(kernels::best_gemm_isa());
  for (kernels::GemmIsa isa : {kernels::GemmIsa::avx512, kernels::GemmIsa::avx2, kernels::GemmIsa::portable}) {
    if (kernels::to_string(isa) != c.experts.isa) continue;
    if (kernels::best_gemm_isa() < isa)
      MOED_THROW(Usage, "[experts].isa = {}: this CPU does not run it (the widest here is {})", c.experts.isa,
                 kernels::to_string(kernels::best_gemm_isa()));
    return kernels::set_gemm_isa(isa);
  }
}

// Whether this run may claim that a token's bits do not depend on its batch:
// the fixed-order GEMM probed on this CPU at this model's shapes (k as
// served, up to three blocks of it; n as one full panel plus the shape's
// edge), for the router and, unless they run on OpenBLAS, the experts.
struct Numerics {
  bool batch_invariant = false;
  std::string description;
};

Numerics probe_numerics(const Config& c) {
  const std::size_t H = std::size_t(c.model.hidden), F = std::size_t(c.model.ffn), E = std::size_t(c.model.experts);
  const bool experts_fixed = c.experts.gemm == "fixed-order";
  std::vector<std::pair<std::size_t, std::size_t>> shapes{{E, H}};  // (n, k)
  if (experts_fixed) shapes.insert(shapes.end(), {{2 * F, H}, {H, F}});
  for (auto [n, k] : shapes) {
    kernels::InvarianceProbe probe = kernels::probe_row_invariance(16 + n % 16, std::min<std::size_t>(k, 600));
    if (!probe.invariant) return {false, "NOT batch-invariant: the start-up probe failed: " + probe.detail};
  }
  const std::string isa = kernels::to_string(kernels::gemm_isa());
  if (!experts_fixed)
    return {false, fmt::format("experts on OpenBLAS sgemm ([experts].gemm): bit-exact across ranks and "
                               "placements, not across batches; router on the fixed-order GEMM ({})",
                               isa)};
  return {true, fmt::format("batch-invariant: fixed-order GEMM ({}), probed at start-up", isa)};
}

// The step's figures over all ranks, on rank 0 (the other ranks keep their
// own record): one gather of every rank's block (runtime/engine/step_record.h).
StepRecord reduce_record(comm::ControlChannel& control, const StepRecord& mine, std::uint64_t step) {
  const std::vector<std::byte> block = encode_step_figures(mine);
  const std::vector<std::byte> all = control.gather(block.data(), block.size(), fmt::format("figures of step {}", step));
  if (control.rank() != 0) return mine;
  return reduce_step_figures(mine, all, control.size(), step);
}

// Bias balancing resumes the biases the statistics file kept: rank 0 read it,
// and every rank must hold the same biases.
void resume_router_biases(const Config& c, comm::ControlChannel& control, const routing::RoutingStats* stats,
                          Engine& engine) {
  if (c.router.bias_gamma <= 0) return;
  std::vector<double> bias(std::size_t(c.model.layers) * std::size_t(c.model.experts), 0.0);
  std::uint64_t resumed = 0;
  if (control.rank() == 0 && stats && stats->router_bias().size() == bias.size()) {
    bias = stats->router_bias();
    resumed = 1;
  }
  control.broadcast(&resumed, sizeof resumed, "whether router biases were resumed");
  if (!resumed) return;
  control.broadcast(bias.data(), bias.size() * sizeof(double), "the resumed router biases");
  engine.set_router_biases(std::move(bias));
  if (control.rank() == 0) spdlog::info("resuming the router biases of {}", c.stats.file);
}

// Traces are joined on rank 0 only (the other ranks send their records there).
nlohmann::json trace_answer(const trace::Tracer* tracer, const admin::Request& r) {
  if (!tracer)
    return admin::error_body(admin::code::kNotCoordinator,
                             "traces are assembled on rank 0: ask it (moectl --rank 0 trace ID)");
  return tracer->answer(r.params.at("request_id").get<std::uint64_t>());
}

}  // namespace

Daemon::Daemon(const Config& config, const ServeOptions& options, comm::MpiSession& mpi)
    : config_(config),
      options_(options),
      rank_(mpi.rank()),
      control_(mpi.world(), std::chrono::milliseconds(config.comm.timeout_ms)),
      bootstrap_(mpi.world(), std::chrono::milliseconds(config.comm.timeout_ms)) {}

Daemon::~Daemon() = default;

std::unique_ptr<Daemon> Daemon::start(const Config& c, const ServeOptions& options,
                                      comm::MpiSession& mpi, int& exit_code) {
  comm::set_wait_policy({c.comm.wait_spin_polls, c.comm.wait_yield_polls, c.comm.wait_sleep_us, c.comm.wait_sleep_max_us});
  std::unique_ptr<Daemon> d(new Daemon(c, options, mpi));
  if ((exit_code = agree_on_command(d->control_, "serve", c))) return nullptr;
  launch::LaunchInfo where = launch::detect_launch();
  kernels::set_blas_threads(int(c.experts.blas_threads));
  LocalHost local = read_local_host();
  // Bind before anything allocates: memory then comes from the right node.
  launch::BindResult binding{false, -1, "not bound ([cluster].bind_numa = false)"};
  if (c.cluster.bind_numa && local.hwloc) binding = launch::bind_to_gpu_numa(*local.hwloc, where.local_rank);

  // Every rank tries, then all agree before anyone serves. Two rounds: the
  // transport's creation is collective, so it waits until every rank has
  // come through the local steps (a rank that failed would not reach it).
  auto attempt = [&](const char* what, auto&& step) {
    int code = 0;
    try {
      step();
    } catch (const Error& e) {
      spdlog::error("start-up failed: {}", e.describe());
      code = e.exit_code();
    } catch (const std::exception& e) {
      spdlog::error("start-up failed: {}", e.what());
      code = 1;
    }
    code = d->control_.all_max(code, what);
    if (code != 0 && d->rank_ == 0) spdlog::error("not serving: start-up failed (see the errors above)");
    return code;
  };
  Numerics numerics;
  exit_code = attempt("start-up status", [&] {
    choose_gemm_isa(c);
    numerics = probe_numerics(c);
    d->fault_ = fault_from_env();
    FoundIslands found = discover_islands(c, d->control_, where, local.host);
    if (local.error) std::rethrow_exception(local.error);
    d->topology_.emplace(found.islands.island_of_rank);
    d->islands_source_ = found.islands.source;
    d->placement_ = initial_placement(c, *d->topology_);
    // Before the weights: sizes the host cannot hold are refused naming their keys.
    refuse_if_too_large(
        estimate_rank_memory(c, placement::slot_groups(d->placement_, d->rank_), mpi.size(), d->rank_),
        std::max(1, where.local_size), fmt::format("rank {}", d->rank_));
    d->store_.emplace(ExpertStore::load(c, d->placement_, d->rank_));
    d->workload_ = make_workload(c, d->store_->layer(0).gate.data());
    d->stats_ = initial_stats(c, d->rank_, mpi.size());
    check_output_paths(options, d->rank_, c, d->dump_);
  });
  if (exit_code == 0) {
    // The claim holds for the job only if it holds on every rank's CPU.
    if (!numerics.batch_invariant && c.experts.gemm == "fixed-order") spdlog::warn("numerics: {}", numerics.description);
    if (d->control_.all_max(numerics.batch_invariant ? 0 : 1, "numerics probe") && numerics.batch_invariant)
      numerics = {false, "NOT batch-invariant: the start-up probe failed on another rank (see its log)"};
  }
  if (exit_code == 0)
    exit_code = attempt("transport status", [&] { d->transport_ = comm::create_transport(c.comm, d->bootstrap_); });
  if (exit_code != 0) return nullptr;
  // Waits of the control plane keep the transport progressing (a UCX put to
  // a rank that sits in a control collective needs that rank's progress).
  d->control_.set_progress([t = d->transport_.get()] { t->progress(); });

  d->engine_ = std::make_unique<Engine>(c, *d->transport_, *d->topology_, d->placement_,
                                        *d->store_, d->workload_.get());
  if (d->stats_) d->engine_->record_stats_into(&*d->stats_, std::size_t(c.stats.follow_tokens));
  resume_router_biases(c, d->control_, d->stats_ ? &*d->stats_ : nullptr, *d->engine_);
  d->trace_selector_.emplace(c.trace.sample, std::size_t(c.trace.follow_max));
  d->engine_->trace_with(&*d->trace_selector_);
  if (d->rank_ == 0) d->tracer_ = std::make_unique<trace::Tracer>(std::size_t(c.trace.ring), int(c.model.layers), c.trace.sample);
  d->snapshot_ = std::make_unique<Snapshot>(c, d->rank_, d->topology_->island_of_ranks());
  d->control_plane_ = std::make_unique<ControlPlane>(ControlContext{
      c, d->rank_, mpi.size(), d->control_, *d->transport_, *d->store_, d->placement_, *d->topology_,
      d->stats_ ? &*d->stats_ : nullptr, *d->snapshot_, &stop_signal, &signal_name});
  if (!c.admin.dir.empty()) {
    // A third round: a socket one rank cannot open stops every rank alike.
    exit_code = attempt("admin socket status", [&] {
      ControlPlane* cp = d->control_plane_.get();
      const Snapshot* snapshot = d->snapshot_.get();
      const trace::Tracer* tracer = d->tracer_.get();
      d->admin_ = std::make_unique<admin::AdminServer>(
          c.admin.dir, d->rank_, 0,
          admin::Handlers{[snapshot, tracer](const admin::Request& r) {
                            if (r.cmd == "trace") return trace_answer(tracer, r);
                            return snapshot_answer(*snapshot, r);
                          },
                          [cp](admin::Request r, admin::Reply reply) { cp->submit(std::move(r), std::move(reply)); }});
      spdlog::info("admin socket {}", d->admin_->path());
    });
    if (exit_code != 0) return nullptr;
  }
  if (!c.metrics.listen.empty()) {
    // Rank 0 alone listens (it holds the job's figures); a port it cannot
    // bind stops every rank alike.
    exit_code = attempt("metrics endpoint status", [&] {
      if (d->rank_ != 0) return;
      // More rows, more pages (runtime/observe/http/http_server.h).
      std::vector<http::Route> routes{http::metrics_route(*d->snapshot_)};
      if (d->tracer_) routes.push_back(http::trace_route(*d->tracer_));
      for (http::Route& route : http::dashboard_routes(*d->snapshot_, int(c.model.layers), int(c.model.experts)))
        routes.push_back(std::move(route));
      d->http_ = std::make_unique<http::Server>(parse_listen_address(c.metrics.listen, "[metrics].listen"),
                                                "[metrics].listen", std::move(routes));
      spdlog::info("metrics endpoint {}", d->http_->url("/metrics"));
      spdlog::info("dashboard {}", d->http_->url("/"));
    });
    if (exit_code != 0) return nullptr;
  }
  if (c.workload.kind == "ingress") {
    // Like the admin socket: a front door one rank cannot open stops every rank alike.
    exit_code = attempt("front door status", [&] {
      d->front_door_ = std::make_unique<ingress::FrontDoor>(c.ingress.dir, d->rank_, mpi.size(), int(c.model.hidden),
                                                            int(c.model.layers), ingress_limits(c));
      spdlog::info("front door {}", d->front_door_->path());
    });
    if (exit_code != 0) return nullptr;
  }
  // No GPU is used yet: the CPU path serves (the CUDA kernels are not wired in).
  const std::string tokens =
      d->front_door_ ? "tokens from its front door"
                     : fmt::format("tokens [{}, {}) of each step", d->engine_->first_token(),
                                   d->engine_->first_token() + d->engine_->local_tokens());
  spdlog::info("on {} (local rank {} of {}, launched by {}; {}), island {}, {} expert slots ({:.1f} MB), {}",
               where.host, where.local_rank, where.local_size, where.launcher,
               launch::describe_binding(where, launch::probe_binding(/*gpu_count=*/0)) + "; " +
                   binding.description,
               d->topology_->island_of(d->rank_), d->store_->slots(),
               double(d->store_->expert_bytes()) / 1e6, tokens);

  d->start_placement_ = describe_placement(c, d->placement_);
  d->start_epoch_ = d->placement_.epoch();
  RunInfo info{mpi.size(), d->topology_->islands(), d->store_->shape(),
               std::uint64_t(c.workload.kind == "ingress" ? 0 : c.workload.tokens_per_step),
               std::uint64_t(c.workload.steps),
               std::uint64_t(c.workload.warmup_steps), d->transport_->name(),
               describe_workload(c, d->workload_.get()), d->start_placement_,
               kernels::blas_description(), d->topology_->describe(), numerics.batch_invariant,
               numerics.description, describe_router_policies(c)};
  d->report_ = std::make_unique<Report>(info, int(c.metrics.load_window_steps));
  if (d->rank_ == 0) {
    spdlog::info("serving {} with {} ranks ({}, islands from {}), {}", info.shape.describe(), info.ranks,
                 info.topology, d->islands_source_, info.placement);
    spdlog::info("workload: {}", info.workload);
    if (numerics.batch_invariant)
      spdlog::info("numerics: {}", numerics.description);
    else
      spdlog::warn("numerics: {}", numerics.description);
  }
  d->snapshot_->note_loaded();
  return d;
}

// The dump is in token order; a shuffled step serves its tokens out of it.
const std::byte* Daemon::in_token_order(std::uint64_t step, const std::vector<std::byte>& rows) {
  if (config_.workload.order != "shuffled") return rows.data();
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
  const auto started = std::chrono::steady_clock::now();
  if (rank_ == 0) report_->boundary(now_seconds());
  if (!control_plane_->boundary(step)) return false;
  follow_requests(step);
  // With no work anywhere, every rank waits a little longer each time (up to
  // [ingress].idle_wait_us), so an idle daemon sleeps instead of spinning.
  const auto idle = std::min<std::int64_t>(config_.ingress.idle_wait_us, std::int64_t(50) << std::min(idle_turns_, 20));
  front_door_->wait_for_work(std::chrono::microseconds(idle));
  front_door_->take(batches_);
  std::vector<Engine::LayerRows> rows(batches_.size());
  for (std::size_t l = 0; l < batches_.size(); ++l)
    rows[l] = {batches_[l].x.data(), batches_[l].rows(), batches_[l].request_ids.data(), batches_[l].positions.data()};
  const std::vector<std::uint32_t> counts = engine_->agree_layer_counts(rows, step);
  if (std::all_of(counts.begin(), counts.end(), [](std::uint32_t n) { return n == 0; })) {
    ++idle_turns_;
    return true;
  }
  idle_turns_ = 0;
  maybe_inject(fault_, rank_, served_);
  StepRecord rec = engine_->run_layers(step, rows, counts);
  front_door_->complete(batches_);
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
  report_->print(std::cout);
  std::cout.flush();
  if (!options_.report_json.empty()) report_->write_json(options_.report_json);
  if (const int signal = control_plane_->stopped_by())
    spdlog::warn("moed: stopped by {} after {} steps: drained, report{} written, sockets removed",
                 signal_name(signal), report_->steps_served(), config_.stats.file.empty() ? "" : " and statistics");
}

int print_topology(const Config& c, comm::MpiSession& mpi) {
  comm::ControlChannel control(mpi.world(), std::chrono::milliseconds(c.comm.timeout_ms));
  if (int code = agree_on_command(control, "--print-topology", c)) return code;
  const launch::LaunchInfo where = launch::detect_launch();
  LocalHost local = read_local_host();
  int exit_code = 0;
  std::optional<FoundIslands> found;
  try {
    found = discover_islands(c, control, where, local.host);
    if (local.error) std::rethrow_exception(local.error);
  } catch (const Error& e) {
    spdlog::error("{}", e.describe());
    exit_code = e.exit_code();
  }
  exit_code = control.all_max(exit_code, "topology status");
  if (exit_code == 0 && mpi.rank() == 0) std::cout << launch::describe_job(found->ranks, found->islands) << std::flush;
  return exit_code;
}

int serve(const Config& config, const ServeOptions& options, comm::MpiSession& mpi) {
  int exit_code = 0;
  install_stop_signals();  // from here on, SIGTERM and SIGINT drain (runtime/daemon/stop_signal.h)
  std::unique_ptr<Daemon> daemon = Daemon::start(config, options, mpi, exit_code);
  if (!daemon) return exit_code;
  for (std::uint64_t step = 0; daemon->serve_step(step); ++step) {
  }
  daemon->finish();
  return 0;
}

}  // namespace moed::runtime
