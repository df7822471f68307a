// The daemon's start-up, in named steps run in rounds: every rank tries a
// round's steps, then all of them learn the worst exit code (an all_max), so
// that a failure on one rank stops every rank at the same point, and a
// collective that follows (the transport's creation, the router biases'
// broadcast) is reached by all of them or by none. Also `moed --print-topology`.
#include "runtime/daemon/daemon.h"

#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <map>
#include <sstream>

#include "comm/idle_backoff.h"
#include "runtime/join/join_bootstrap.h"
#include "comm/mpi/mpi_control_link.h"
#include "comm/transport_control_link.h"
#include "common/error.h"
#include "common/listen_address.h"
#include "common/log.h"
#include "common/rng.h"
#include "kernels/cpu/bf16_dot_gemm.h"
#include "kernels/cpu/fixed_order_gemm.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/quant_weights.h"
#include "launch/hwloc_topology.h"
#include "launch/launch_env.h"
#include "launch/numa_binding.h"
#include "launch/nvlink_islands.h"
#include "launch/rank_gpu.h"
#include "launch/rank_topology_codec.h"
#include "launch/topology_description.h"
#include "placement/survivors.h"
#include "placement/memory_plan.h"
#include "placement/placement_file.h"
#include "placement/redundancy.h"
#include "placement/shard_rules.h"
#include "routing/stats_file.h"
#include "runtime/config/memory_estimate.h"
#include "runtime/control/snapshot_answer.h"
#include "runtime/daemon/start_up.h"
#include "runtime/daemon/stop_signal.h"
#include "runtime/engine/expert_device.h"
#include "runtime/observe/http/dashboard_routes.h"

namespace moed::runtime {

std::string command_summary(std::string_view mode, std::string_view printed_config) {
  return fmt::format("{} with configuration {:016x}", mode, hash_name(printed_config));
}

std::string placement_details(const placement::Placement& p) {
  int replicated = 0, split = 0;
  for (int l = 0; l < p.layers(); ++l)
    for (int e = 0; e < p.experts(); ++e) {
      split += p.sharded(l, e);
      replicated += p.copies(l, e) > 1;  // a split expert too, when held twice or more
    }
  return fmt::format("epoch {}, {} replicated experts{}, at most {} slots per rank", p.epoch(), replicated,
                     split ? fmt::format(", {} split expert{}", split, split == 1 ? "" : "s") : "",
                     p.max_slots_per_rank());
}

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
std::string this_command(const std::string& mode, const Config& c) {
  std::ostringstream effective;
  print_config(effective, c);
  return command_summary(mode, effective.str());
}

int agree_on_command(comm::ControlChannel& control, const std::string& mode, const Config& c,
                     std::string* command = nullptr) {
  const std::string mine = this_command(mode, c);
  if (command) *command = mine;
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
                   : placement::read_placement_file(file, layer_numbers(c.model));
  std::string origin = file.empty() ? "[placement].policy" : file;
  placement::check_placement_shape(p, ranks, L, E, origin);
  // Every expert on N islands from the start (elastic serving: a lost rank
  // then orphans nothing); every rank plans alike, with no statistics.
  if (c.placement.redundancy > 1) {
    p = placement::add_island_redundancy(p, placement::alike_loads(L, E), topology, int(c.placement.redundancy));
    origin += fmt::format(" with [placement].redundancy = {}", c.placement.redundancy);
  }
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

std::string describe_placement(const Config& c, const placement::Placement& p) {
  const std::string file = placement_origin(c);
  return fmt::format("{} ({})", file.empty() ? std::string(name_of(c.placement.policy)) : "file " + file, placement_details(p));
}

// Output files are opened (or checked) before the first step, so that a bad
// path is a start-up error every rank agrees on, not a failure at the end.
void check_output_paths(const ServeOptions& options, int rank, const Config& c,
                        std::unique_ptr<OutputDump>& dump) {
  if (c.workload.kind == WorkloadKind::ingress && !options.dump_output.empty())
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

// The front door's counters as status shows them.
nlohmann::json front_door_json(const ingress::FrontDoor& door) {
  const ingress::FrontDoorCounters c = door.counters();
  nlohmann::json out{{"clients", c.clients},        {"accepted", c.accepted},
                     {"submits_served", c.submits_served}, {"rows_served", c.rows_served},
                     {"refused", c.refused}};
  if (!door.network_addresses().empty()) {
    const ingress::NetworkCounters n = door.network_counters();
    out["network"] = {{"connections", n.connections},
                      {"logged_in", n.logged_in},
                      {"auth_failures", n.auth_failures},
                      {"handshake_timeouts", n.handshake_timeouts},
                      {"handshakes_refused", n.handshakes_refused},
                      {"silences", n.silences},
                      {"endpoints", n.endpoints}};
  }
  return out;
}

std::string describe_workload(const Config& c, const Workload* w) {
  if (w) return w->describe();
  return fmt::format("front door at {} (at most {} rows per layer per step per rank, {} us to fill)", c.ingress.dir,
                     c.ingress.max_tokens_per_step, c.ingress.max_wait_us);
}

// The fixed-order GEMM kernel [experts].isa names (auto: the widest here).
void choose_gemm_isa(const Config& c) {
  if (c.experts.isa == Isa::automatic) return kernels::set_gemm_isa(kernels::best_gemm_isa());
  const kernels::GemmIsa isa = c.experts.isa == Isa::avx512 ? kernels::GemmIsa::avx512
                               : c.experts.isa == Isa::avx2 ? kernels::GemmIsa::avx2
                                                            : kernels::GemmIsa::portable;
  if (kernels::best_gemm_isa() < isa)
    MOED_THROW(Usage, "[experts].isa = {}: this CPU does not run it (the widest here is {})", name_of(c.experts.isa),
               kernels::to_string(kernels::best_gemm_isa()));
  kernels::set_gemm_isa(isa);
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
  const bool experts_fixed = c.experts.gemm == Gemm::fixed_order;
  std::vector<std::pair<std::size_t, std::size_t>> shapes{{E, H}};  // (n, k)
  if (experts_fixed) shapes.insert(shapes.end(), {{2 * F, H}, {H, F}});
  for (auto [n, k] : shapes) {
    kernels::InvarianceProbe probe = kernels::probe_row_invariance(16 + n % 16, std::min<std::size_t>(k, 600));
    if (!probe.invariant) return {false, "NOT batch-invariant: the start-up probe failed: " + probe.detail};
  }
  // The experts' own format: its decoders and GEMM at the experts' shapes
  // (k rounded down to the format's scale grain, which mxfp4 requires).
  kernels::WeightDtype held = kernels::WeightDtype::f32;
  kernels::parse_weight_dtype(experts_dtype(c), &held);
  if (experts_fixed && held != kernels::WeightDtype::f32)
    for (std::size_t k : {H, F}) {
      const std::size_t grain = kernels::column_grain(held), probe_k = std::max(grain, std::min<std::size_t>(k, 600) / grain * grain);
      kernels::InvarianceProbe probe = kernels::probe_row_invariance(held, 16 + (2 * F) % 16, probe_k);
      if (!probe.invariant) return {false, "NOT batch-invariant: the start-up probe failed: " + probe.detail};
    }
  const std::string isa = kernels::to_string(kernels::gemm_isa()) +
                          (held == kernels::WeightDtype::f32
                               ? ""
                               : fmt::format(", experts in {}, {} products", kernels::to_string(held),
                                             kernels::to_string(kernels::compact_products())));
  if (!experts_fixed)
    return {false, fmt::format("experts on OpenBLAS sgemm ([experts].gemm): bit-exact across ranks and "
                               "placements, not across batches; router on the fixed-order GEMM ({})",
                               isa)};
  return {true, fmt::format("batch-invariant: fixed-order GEMM ({}), probed at start-up", isa)};
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

// Start-up on one rank, step by step: each step builds a part of the daemon
// (`d_`); what only start-up needs (where the rank runs, its host, its
// numerics) is kept here.
class Daemon::Startup {
 public:
  using Step = void (Startup::*)();
  // A round: the steps each rank tries, in order (the first that throws ends
  // its try), then every rank's worst exit code, all_max'ed as `status`.
  // `wanted` (null: always) skips a round on every rank alike (the ranks
  // agreed on the config); `together`, once every rank came through, is
  // work they do together (collectives), outside the try.
  struct Round {
    const char* status;
    bool (*wanted)(const Config&);
    std::vector<Step> steps;
    Step together = nullptr;
  };

  // `mpi`: null for a process that joins a running job (join_job).
  Startup(Daemon& d, const ServeOptions& options, comm::MpiSession* mpi)
      : d_(d), c_(d.config_), options_(options), mpi_(mpi) {}

  // Before the rounds: where this rank runs, its host, and its binding.
  void read_host();
  // Round 1: what this rank is, the job's islands (an all-gather) and the
  // placement, the weights, the output paths; then the numerics' agreement.
  void probe_this_rank();
  void use_gpu(const GpuFacts& gpus);
  void agree_topology_and_placement();
  void load_weights();
  void check_outputs() { check_output_paths(options_, d_.rank_, c_, d_.dump_); }
  void agree_numerics();
  // Round 2: the transport (collective); then, together, the engine, the
  // router biases (a broadcast), the tracer, the snapshot and the control plane.
  void open_transport() {
    d_.bootstrap_.emplace(mpi_->world(), std::chrono::milliseconds(c_.comm.timeout_ms));
    comm::CommConfig comm = c_.comm;
    if (device_.device == ExpertDevice::cuda) comm.device = device_.gpu;  // where nccl carries rows
    d_.transport_ = comm::create_transport(comm, *d_.bootstrap_);
  }
  void build_engine_and_control();
  // Rounds 3 to 5, each with its config: what clients reach.
  void open_admin_socket();
  void open_metrics_endpoint();
  void open_front_door();
  void open_join_listener() {
    if (d_.rank_ == 0) d_.open_join_listener();
  }
  // After the rounds: the rank's and the job's description, and the report.
  void announce();
  // A joiner's in place of the rounds' collective steps: the join listener
  // gives it a world rank, then the job as it stands (runtime/join/join_bootstrap.h).
  void join_job(const ListenAddress& listener);
  const comm::View& joined_view() const { return joined_view_; }

  // Runs one round on this rank; returns every rank's worst exit code.
  int run(const Round& round);

 private:
  Daemon& d_;
  const Config& c_;
  const ServeOptions& options_;
  comm::MpiSession* mpi_;  // null for a joiner
  launch::LaunchInfo where_;
  LocalHost local_;
  launch::BindResult binding_{false, -1, "not bound ([cluster].bind_numa = false)"};
  Numerics numerics_;
  DeviceChoice device_;  // where this rank's experts run ([experts].device)
  int gpus_ = 0;         // the GPUs this process sees (under cuda)
  bool spare_ = false;  // from build_engine_and_control on: this rank is a spare, on its own
  comm::View joined_view_;  // a joiner: the members when rank 0 welcomed it
};

void Daemon::Startup::read_host() {
  where_ = launch::detect_launch();
  kernels::set_blas_threads(int(c_.experts.blas_threads));
  local_ = read_local_host();
  // Bind before anything allocates: memory then comes from the right node.
  if (c_.cluster.bind_numa && local_.hwloc) binding_ = launch::bind_to_gpu_numa(*local_.hwloc, where_.local_rank);
}

// Experts on this rank's GPU (launch/rank_gpu.h's rule) compute the CPU's
// fixed-order chains with fp32 products, or with products = bf16 take the
// tensor cores: other products or OpenBLAS have no GPU form.
void Daemon::Startup::use_gpu(const GpuFacts& gpus) {
  if (c_.experts.gemm != Gemm::fixed_order)
    MOED_THROW(Usage, "[experts].device = cuda runs the fixed-order GEMM's chains; [experts].gemm = \"{}\" has no "
               "GPU form", name_of(c_.experts.gemm));
  kernels::set_compact_products(gpu_products(c_.experts.products));
  gpus_ = gpus.gpus;
  device_.gpu = launch::gpu_of_rank(where_.local_rank, gpus.gpus, std::nullopt).device;
  device_.why += fmt::format(", GPU {} of {}", device_.gpu, gpus.gpus);
}

void Daemon::Startup::probe_this_rank() {
  choose_gemm_isa(c_);
  const GpuFacts gpus = probe_gpus();
  device_ = choose_expert_device(c_.experts.device, gpus);
  if (device_.device == ExpertDevice::cuda)
    use_gpu(gpus);  // fp32 products, or bf16 on the tensor cores
  else
    kernels::set_compact_products(local_products(c_));
  numerics_ = probe_numerics(c_);
  d_.fault_ = fault_from_env();
}

void Daemon::Startup::agree_topology_and_placement() {
  FoundIslands found = discover_islands(c_, d_.control_, where_, local_.host);
  if (local_.error) std::rethrow_exception(local_.error);
  d_.serving_ranks_ = mpi_->size() - int(c_.comm.spares);
  if (d_.serving_ranks_ < 1)
    MOED_THROW(Usage, "[comm].spares = {} leaves none of the job's {} ranks to serve", c_.comm.spares, mpi_->size());
  // Spares are the job's last ranks: the placement is over the others. Join
  // slots come after them, each an island of its own until its process
  // joins (place_joiner).
  std::vector<int> islands = found.islands.island_of_rank;
  const int first_free = islands.empty() ? 0 : *std::max_element(islands.begin(), islands.end()) + 1;
  for (int slot = 0; slot < int(c_.comm.join_slots); ++slot) islands.push_back(first_free + slot);
  d_.world_topology_.emplace(std::move(islands));
  d_.present_.assign(std::size_t(d_.world_topology_->ranks()), 0);
  std::fill_n(d_.present_.begin(), mpi_->size(), 1);
  for (const launch::RankTopology& r : found.ranks) d_.world_hosts_.push_back(r.host);
  d_.world_hosts_.resize(std::size_t(d_.world_topology_->ranks()));
  d_.topology_.emplace(placement::topology_on_members(*d_.world_topology_, d_.serving_ranks()));
  d_.islands_source_ = found.islands.source;
  d_.placement_ = initial_placement(c_, *d_.topology_);
}

void Daemon::Startup::load_weights() {
  // Before the weights: sizes the host cannot hold are refused naming their keys.
  d_.local_ranks_ = std::max(1, where_.local_size);
  // A spare holds no expert until it joins (the migration then brings its share).
  const bool spare = d_.rank_ >= d_.serving_ranks_;
  const placement::Placement none(d_.rank_ + 1, int(c_.model.layers), int(c_.model.experts));
  const placement::Placement& mine = spare ? none : d_.placement_;
  refuse_if_too_large(
      estimate_rank_memory(c_, placement::slot_groups(mine, d_.rank_), d_.serving_ranks_, d_.rank_),
      d_.local_ranks_, fmt::format("rank {}", d_.rank_));
  // And what its GPU will hold, against what the GPU has free (shared by
  // the ranks of this host that take the same GPU).
  // Under auto, a GPU too small sends this rank, and so the job, to the CPU.
  if (device_.device == ExpertDevice::cuda) {
    const int sharing = (d_.local_ranks_ + gpus_ - 1) / std::max(1, gpus_);
    try {
      check_memory_fits(
          estimate_device_memory(c_, placement::slot_groups(mine, d_.rank_), d_.serving_ranks_, d_.rank_), sharing,
          gpu_free_memory(device_.gpu), fmt::format("rank {}'s GPU {}", d_.rank_, device_.gpu));
    } catch (const Error& e) {
      if (c_.experts.device != "auto" || e.kind() != ErrorKind::Usage) throw;
      device_ = {ExpertDevice::cpu, 0, fmt::format("[experts].device = auto: cpu, as {}", e.what())};
    }
  }
  d_.store_.emplace(ExpertStore::load(c_, mine, d_.rank_));
  d_.workload_ = make_workload(c_, d_.store_->layer(0).gate.data());
  d_.stats_ = initial_stats(c_, d_.rank_, mpi_ ? mpi_->size() : d_.serving_ranks_);
}

// The claim holds for the job only if it holds on every rank's CPU.
void Daemon::Startup::agree_numerics() {
  // Every rank multiplies compact experts alike: under products = auto, the
  // ranks take what the least able of them runs (amx, then bf16, then f32).
  // An explicit choice is already the same everywhere, or refused.
  const kernels::CompactProducts here = kernels::compact_products();
  const int least = 2 - d_.control_.all_max(2 - products_ability(here), "compact experts' products");
  const kernels::CompactProducts agreed = agreed_products(here, least);
  if (agreed != here) {
    spdlog::info("[experts].products = auto: {}, as another rank cannot run {} products", kernels::to_string(agreed),
                 kernels::to_string(here));
    kernels::set_compact_products(agreed);
    numerics_ = probe_numerics(c_);
  }
  // Under device = auto the job takes the GPU only if every rank can (an
  // explicit cuda is already on every rank, or refused).
  if (d_.control_.all_max(device_.device == ExpertDevice::cpu ? 1 : 0, "where experts run") &&
      device_.device != ExpertDevice::cpu)
    device_ = {ExpertDevice::cpu, 0, "[experts].device = auto: cpu, as another rank has no usable GPU (see its log)"};
  if (d_.rank_ == 0) spdlog::info("experts run on the {} ({})", to_string(device_.device), device_.why);
  if (!numerics_.batch_invariant && c_.experts.gemm == Gemm::fixed_order) spdlog::warn("numerics: {}", numerics_.description);
  if (d_.control_.all_max(numerics_.batch_invariant ? 0 : 1, "numerics probe") && numerics_.batch_invariant)
    numerics_ = {false, "NOT batch-invariant: the start-up probe failed on another rank (see its log)"};
}

void Daemon::Startup::build_engine_and_control() {
  Daemon& d = d_;
  // With spares, the serving ranks go on without them from here (epoch 1 of
  // the transport; elastic.cc admits a spare after a loss). A spare's
  // start-up is its own from here: it builds no engine and takes part in
  // no collective until it joins.
  if (d.serving_ranks_ < d.world_topology_->ranks()) {
    spare_ = d.rank_ >= d.serving_ranks_;
    if (!spare_) d.transport_->continue_with(d.serving_ranks(), 1);
  }
  // Waits of the control plane keep the transport progressing (a UCX put to
  // a rank that sits in a control collective needs that rank's progress).
  d.control_.set_progress([t = d.transport_.get()] { t->progress(); });
  // Every rank has its transport (the round agreed): from here on the
  // control collectives may leave MPI for it.
  if (c_.comm.control == comm::ControlMedium::transport) {
    d.control_.use(comm::transport_control_link(*d.transport_));
    if (d.rank_ == 0) spdlog::info("the control collectives run over the {} transport from here on", d.transport_->name());
  }
  d.trace_selector_.emplace(c_.trace.sample, std::size_t(c_.trace.follow_max));
  if (!spare_) {
    d.engine_ = std::make_unique<Engine>(c_, *d.transport_, *d.topology_, d.placement_, *d.store_, d.workload_.get(),
                                         device_.device, device_.gpu);
    if (d.stats_) d.engine_->record_stats_into(&*d.stats_, std::size_t(c_.stats.follow_tokens));
    resume_router_biases(c_, d.control_, d.stats_ ? &*d.stats_ : nullptr, *d.engine_);
    d.engine_->trace_with(&*d.trace_selector_);
  }
  if (d.rank_ == 0)
    d.tracer_ = std::make_unique<trace::Tracer>(std::size_t(c_.trace.ring), int(c_.model.layers), c_.trace.sample,
                                                 layer_numbers(c_.model));
  d.snapshot_ = std::make_unique<Snapshot>(c_, d.rank_, d.topology_->island_of_ranks());
  d.control_plane_ = std::make_unique<ControlPlane>(ControlContext{
      c_, d.rank_, d.serving_ranks_, d.control_, *d.transport_, *d.store_, d.placement_, *d.topology_,
      d.stats_ ? &*d.stats_ : nullptr, *d.snapshot_, &stop_signal, &signal_name});
}

// A socket one rank cannot open stops every rank alike.
void Daemon::Startup::open_admin_socket() {
  ControlPlane* cp = d_.control_plane_.get();
  const Snapshot* snapshot = d_.snapshot_.get();
  const trace::Tracer* tracer = d_.tracer_.get();
  d_.admin_ = std::make_unique<admin::AdminServer>(
      c_.admin.dir, d_.rank_, 0,
      admin::Handlers{[snapshot, tracer](const admin::Request& r) {
                        if (r.cmd == "trace") return trace_answer(tracer, r);
                        return snapshot_answer(*snapshot, r);
                      },
                      [cp](admin::Request r, admin::Reply reply) { cp->submit(std::move(r), std::move(reply)); }});
  spdlog::info("admin socket {}", d_.admin_->path());
}

// Rank 0 alone listens (it holds the job's figures); a port it cannot bind
// stops every rank alike.
void Daemon::Startup::open_metrics_endpoint() {
  if (d_.rank_ == 0) d_.open_metrics_endpoint();
}

// Like the admin socket: a front door one rank cannot open stops every rank alike.
void Daemon::Startup::open_front_door() {
  if (!spare_) d_.open_front_door(d_.rank_, mpi_->size());  // a spare's opens when it joins
}

wire::Key Daemon::cluster_key() const {
  try {
    return wire::read_key_file(config_.ingress.key_file);
  } catch (const std::runtime_error& e) {
    MOED_THROW(Usage, "[ingress].key_file: {}", e.what());
  }
}

void Daemon::open_front_door(int world_rank, int world_ranks) {
  const ModelSpec spec = model_spec(config_.model);
  ingress::ModelLayers layers{std::vector<int>(std::size_t(spec.model_layers), -1), spec.describe_dense()};
  for (int l = 0; l < spec.model_layers; ++l) layers.batch_of[std::size_t(l)] = spec.moe_index(l);
  for (int d = 0; d < store_->dense_layers(); ++d)  // served dense layers: batches after the MoE layers'
    layers.batch_of[std::size_t(store_->dense_model_layer(d))] = int(config_.model.layers) + d;
  std::optional<ingress::NetworkOptions> network;
  if (!config_.ingress.listen.empty()) {
    network.emplace();
    network->listen = ingress::rank_listen_addresses(config_.ingress.listen, world_rank);
    network->key = cluster_key();
    network->transports = config_.ingress.transports;
    network->handshake_timeout = std::chrono::milliseconds(config_.ingress.handshake_timeout_ms);
    network->ping_interval = std::chrono::milliseconds(config_.ingress.ping_interval_ms);
    network->silence_timeout = std::chrono::milliseconds(config_.ingress.silence_timeout_ms);
    network->max_handshakes = int(config_.ingress.max_handshakes);
    network->max_handshakes_per_peer = int(config_.ingress.max_handshakes_per_peer);
  }
  front_door_ = std::make_unique<ingress::FrontDoor>(config_.ingress.dir, world_rank, world_ranks,
                                                     int(config_.model.hidden), std::move(layers),
                                                     ingress_limits(config_), std::move(network));
  spdlog::info("front door {}", front_door_->path());
  for (const std::string& a : front_door_->network_addresses()) spdlog::info("front door {}", a);
  if (snapshot_)
    snapshot_->set_front_door_counters([door = front_door_.get()] { return front_door_json(*door); });
}

void Daemon::Startup::announce() {
  Daemon& d = d_;
  // No GPU is used yet: the CPU path serves (the CUDA kernels are not wired in).
  const std::string tokens =
      spare_ ? "a spare: serves nothing until it joins"
      : d.front_door_ ? "tokens from its front door"
                    : fmt::format("tokens [{}, {}) of each step", d.engine_->first_token(),
                                  d.engine_->first_token() + d.engine_->local_tokens());
  const std::string whole =
      d.store_->shared_bytes() ? fmt::format(" + {:.1f} MB every rank holds (shared experts, dense layers)",
                                             double(d.store_->shared_bytes()) / 1e6)
                               : "";
  spdlog::info("on {} (local rank {} of {}, launched by {}; {}), island {}, {} expert slots ({:.1f} MB in {}){}, {}",
               where_.host, where_.local_rank, where_.local_size, where_.launcher,
               launch::describe_binding(where_, launch::probe_binding(/*gpu_count=*/0)) + "; " +
                   binding_.description,
               d.world_topology_->island_of(d.rank_), d.store_->slots(), double(d.store_->expert_bytes()) / 1e6,
               kernels::to_string(d.store_->dtype()), whole, tokens);

  d.start_placement_ = describe_placement(c_, d.placement_);
  d.start_epoch_ = d.placement_.epoch();
  RunInfo info{d.serving_ranks_, d.topology_->islands(), d.store_->shape(),
               std::uint64_t(c_.workload.kind == WorkloadKind::ingress ? 0 : c_.workload.tokens_per_step),
               std::uint64_t(c_.workload.steps),
               std::uint64_t(c_.workload.warmup_steps), d.transport_->name(),
               describe_workload(c_, d.workload_.get()), d.start_placement_,
               kernels::blas_description(), d.topology_->describe(), numerics_.batch_invariant,
               numerics_.description, describe_router_policies(c_), std::string(name_of(c_.comm.control)),
               std::string(to_string(device_.device))};
  d.report_ = std::make_unique<Report>(info, int(c_.metrics.load_window_steps));
  if (d.rank_ == 0) {
    spdlog::info("serving {} with {} ranks ({}, islands from {}), {}", info.shape.describe(), info.ranks,
                 info.topology, d.islands_source_, info.placement);
    spdlog::info("workload: {}", info.workload);
    if (numerics_.batch_invariant)
      spdlog::info("numerics: {}", numerics_.description);
    else
      spdlog::warn("numerics: {}", numerics_.description);
  }
}

int Daemon::Startup::run(const Round& round) {
  int code = 0;
  try {
    for (Step step : round.steps) (this->*step)();
  } catch (const Error& e) {
    spdlog::error("start-up failed: {}", e.describe());
    code = e.exit_code();
  } catch (const std::exception& e) {
    spdlog::error("start-up failed: {}", e.what());
    code = 1;
  }
  if (spare_) return code;  // the serving ranks' rounds go on without it
  code = d_.control_.all_max(code, round.status);
  if (code != 0 && d_.rank_ == 0) spdlog::error("not serving: start-up failed (see the errors above)");
  return code;
}

void Daemon::open_metrics_endpoint() {
  // More rows, more pages (runtime/observe/http/http_server.h).
  std::vector<http::Route> routes{http::metrics_route(*snapshot_)};
  if (tracer_) routes.push_back(http::trace_route(*tracer_));
  for (http::Route& route :
       http::dashboard_routes(*snapshot_, int(config_.model.layers), int(config_.model.experts)))
    routes.push_back(std::move(route));
  http_ = std::make_unique<http::Server>(parse_listen_address(config_.metrics.listen, "[metrics].listen"),
                                         "[metrics].listen", std::move(routes));
  spdlog::info("metrics endpoint {}", http_->url("/metrics"));
  spdlog::info("dashboard {}", http_->url("/"));
}

Daemon::Started Daemon::start(const Config& c, const ServeOptions& options, comm::MpiSession& mpi) {
  comm::set_wait_policy({c.comm.wait_spin_polls, c.comm.wait_yield_polls, c.comm.wait_sleep_us, c.comm.wait_sleep_max_us});
  std::unique_ptr<Daemon> d(new Daemon(c, options, mpi));
  if (const int code = agree_on_command(d->control_, "serve", c, &d->command_)) return {nullptr, code};
  using S = Startup;
  // The transport's creation is collective: its round waits until every rank
  // has come through the local steps (a rank that failed would not reach it).
  const S::Round rounds[] = {
      {"start-up status", nullptr,
       {&S::probe_this_rank, &S::agree_topology_and_placement, &S::load_weights, &S::check_outputs},
       &S::agree_numerics},
      {"transport status", nullptr, {&S::open_transport}, &S::build_engine_and_control},
      {"admin socket status", [](const Config& c) { return !c.admin.dir.empty(); }, {&S::open_admin_socket}},
      {"metrics endpoint status", [](const Config& c) { return !c.metrics.listen.empty(); }, {&S::open_metrics_endpoint}},
      {"front door status", [](const Config& c) { return c.workload.kind == WorkloadKind::ingress; }, {&S::open_front_door}},
      {"join listener status", [](const Config& c) { return c.comm.join_slots > 0; }, {&S::open_join_listener}},
  };
  S start_up(*d, options, &mpi);
  start_up.read_host();
  for (const S::Round& round : rounds) {
    if (round.wanted && !round.wanted(c)) continue;
    if (const int code = start_up.run(round)) return {nullptr, code};
    if (round.together) (start_up.*round.together)();
  }
  start_up.announce();
  if (c.comm.elastic) {
    // With spares or join slots, the serving ranks went on without them at start (epoch 1).
    const bool without_some = d->serving_ranks_ < d->world_topology_->ranks();
    d->watch_for_losses(comm::View{without_some ? 1u : 0u, d->serving_ranks()}, d->rank_ >= d->serving_ranks_);
  }
  d->snapshot_->note_loaded();
  return {std::move(d), 0};
}

namespace {

kernels::CompactProducts products_named(const std::string& name) {
  using P = kernels::CompactProducts;
  for (P p : {P::f32, P::bf16, P::int8, P::amx})
    if (name == kernels::to_string(p)) return p;
  MOED_THROW(Runtime, "the join listener names compact products \"{}\", which this moed does not know", name);
}

}  // namespace

void Daemon::Startup::join_job(const ListenAddress& listener) {
  Daemon& d = d_;
  const wire::Key key = d.cluster_key();
  const kernels::CompactProducts here = kernels::compact_products();
  d.command_ = this_command("serve", c_);
  spdlog::info("joining the job at {} (host {})", listener.describe(), where_.host);
  auto bootstrap = std::make_unique<join::JoinBootstrap>(listener, key, d.command_, where_.host, products_ability(here),
                                                         std::chrono::milliseconds(c_.comm.timeout_ms));
  d.rank_ = bootstrap->rank();
  init_logging(d.rank_, c_.log.level);
  spdlog::info("offered world rank {} of {}: waiting until every member has reached it", d.rank_,
               bootstrap->offer().world_ranks);
  d.transport_ = comm::create_transport(c_.comm, *bootstrap);
  const join::Welcome& w = bootstrap->welcome();
  // Every rank multiplies compact experts alike (agree_numerics).
  const kernels::CompactProducts job = products_named(w.products);
  if (agreed_products(here, products_ability(job)) != job)
    MOED_THROW(Usage, "the job multiplies compact experts with {} products; this host chooses {} ([experts].products)",
               kernels::to_string(job), kernels::to_string(here));
  if (job != here) {
    kernels::set_compact_products(job);
    numerics_ = probe_numerics(c_);
  }
  if (!numerics_.batch_invariant && c_.experts.gemm == Gemm::fixed_order)
    MOED_THROW(Runtime, "not joining: this host would break the job's bit-exactness ({})", numerics_.description);
  d.world_topology_.emplace(w.islands);
  d.world_hosts_ = w.hosts;
  d.present_.assign(w.addresses.size(), 0);
  for (std::size_t r = 0; r < w.addresses.size(); ++r) d.present_[r] = !w.addresses[r].empty() || int(r) == d.rank_;
  d.serving_ranks_ = w.serving_ranks;
  d.topology_.emplace(placement::topology_on_members(*d.world_topology_, w.view.members));
  // Rank 0's placement comes with the admission (share_state_with_joiners).
  d.placement_ = placement::make_placement(c_.placement.policy, int(w.view.members.size()), int(c_.model.layers),
                                           int(c_.model.experts), std::uint64_t(c_.placement.seed));
  d.islands_source_ = "rank 0's, as it welcomed this rank";
  joined_view_ = w.view;
  d.join_bootstrap_ = std::move(bootstrap);
}

std::unique_ptr<Daemon> Daemon::join(const Config& c, const ServeOptions& options, const std::string& listener) {
  if (c.comm.join_slots == 0)
    MOED_THROW(Usage, "--join: [comm].join_slots = 0 in this config; a joiner runs with the job's own config, "
               "which keeps slots for it");
  const ListenAddress address = parse_listen_address(listener, "--join");
  comm::set_wait_policy({c.comm.wait_spin_polls, c.comm.wait_yield_polls, c.comm.wait_sleep_us, c.comm.wait_sleep_max_us});
  std::unique_ptr<Daemon> d(new Daemon(c, options, -1, nullptr));
  // The rounds' local steps, each throwing at once: no other rank waits on
  // this one until it is admitted.
  Startup s(*d, options, nullptr);
  s.read_host();
  s.probe_this_rank();
  s.join_job(address);
  s.load_weights();
  s.check_outputs();
  s.build_engine_and_control();
  if (!c.admin.dir.empty()) s.open_admin_socket();
  s.announce();
  d->watch_for_losses(s.joined_view(), /*spare=*/true);
  d->snapshot_->note_loaded();
  return d;
}

int print_topology(const Config& c, comm::MpiSession& mpi) {
  comm::ControlChannel control(comm::mpi_control_link(mpi.world(), std::chrono::milliseconds(c.comm.timeout_ms)));
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

}  // namespace moed::runtime
