#include "runtime/config/config.h"

#include <filesystem>
#include <fstream>
#include <optional>
#include <ostream>
#include <set>
#include <sstream>

#include "common/error.h"
#include "common/listen_address.h"
#include "common/log.h"

namespace moed::runtime {

namespace {

using config::choice;
using config::flag;
using config::integer;
using config::real;
using config::text;

std::vector<std::string> family_choices() {
  std::vector<std::string> names{"auto"};
  for (const auto& n : kFamilyNames.names()) names.push_back(n);
  return names;
}

const config::Section<ModelConfig>& model_section() {
  using C = ModelConfig;
  static const config::Section<C> s(
      "model", "the MoE layers served",
      {
          integer<C>("layers", &C::layers, 4, 1, 4096, "MoE layers served per step"),
          integer<C>("experts", &C::experts, 8, 1, 65536, "experts per layer"),
          integer<C>("top_k", &C::top_k, 2, 1, 64, "experts chosen per token (top-k mode)"),
          integer<C>("hidden", &C::hidden, 512, 1, 1 << 20, "hidden size H of a token row"),
          integer<C>("ffn", &C::ffn, 1024, 1, 1 << 22, "FFN size F of one expert"),
          choice<C>("dtype", &C::dtype, "f32", {"f32", "bf16"},
                    "dtype of the weights file (computed in fp32 on CPU)"),
          text<C>("weights", &C::weights, "",
                  "safetensors file, index.json or folder; empty = synthetic weights made in "
                  "memory from seed (the values --generate-weights writes)"),
          flag<C>("check_finite", &C::check_finite, true,
                  "refuse weights holding NaN or inf at load (one pass over each tensor)"),
          integer<C>("seed", &C::seed, 42, 0, INT64_MAX, "seed of the synthetic weights"),
          real<C>("norm_eps", &C::norm_eps, 1e-5, 0, 1, "epsilon of the RMSNorm before each MoE block"),
          choice<C>("family", &C::family, "auto", family_choices(),
                    "the model family whose MoE arithmetic is served (docs/model-families.md); auto: "
                    "config.json's model_type beside the weights, else mixtral"),
          integer<C>("groups", &C::groups, 0, 0, 4096,
                     "synthetic deepseek_v3: expert groups of the router (n_group); 0 = 8, 4 or 2, the "
                     "most that divide the experts"),
          integer<C>("groups_kept", &C::groups_kept, 0, 0, 4096,
                     "synthetic deepseek_v3: groups a token's experts come from (topk_group); 0 = half"),
          integer<C>("shared_experts", &C::shared_experts, -1, -1, 64,
                     "synthetic: shared expert width in units of ffn (deepseek_v3: n_shared_experts, "
                     "qwen2_moe: shared_expert_intermediate_size / ffn); -1 = the family's (1, 4, else 0)"),
          integer<C>("dense_layers", &C::dense_layers, 0, 0, 4096,
                     "synthetic: dense layers before the first MoE layer (model layers 0 .. n-1)"),
          flag<C>("serve_dense", &C::serve_dense, false,
                  "serve the model's dense FFN layers too, each as one expert every rank holds; off: a "
                  "client's dense layer is refused"),
      });
  return s;
}

const config::Section<RouterConfig>& router_section() {
  using C = RouterConfig;
  static const config::Section<C> s(
      "router", "expert choice per token (fp32, deterministic; ties go to the lower expert id)",
      {
          choice<C>("mode", &C::mode, RouterMode::topk, kRouterModeNames,
                    "topk: the top_k most probable experts; topp: the fewest whose probability "
                    "reaches top_p, within [min_k, max_k]"),
          real<C>("temperature", &C::temperature, 1.0, 1e-3, 1e3, "softmax temperature of the gate"),
          real<C>("top_p", &C::top_p, 0.7, 1e-6, 1.0, "probability mass to cover in topp mode"),
          integer<C>("min_k", &C::min_k, 1, 1, 64, "fewest experts per token in topp mode"),
          integer<C>("max_k", &C::max_k, 0, 0, 64, "most experts per token in topp mode; 0 = top_k"),
          real<C>("smoothing_beta", &C::smoothing_beta, 0, 0, 1e3,
                  "smoothing: bonus added, for selection only, to the logits of the experts the same "
                  "request's previous position chose at the same layer; 0 = off"),
          integer<C>("smoothing_max_requests", &C::smoothing_max_requests, 65536, 1, 1 << 24,
                     "smoothing (and the flip rate): requests remembered at most; the least recently "
                     "seen leaves first"),
          integer<C>("smoothing_idle_steps", &C::smoothing_idle_steps, 64, 1, 1 << 30,
                     "smoothing (and the flip rate): a request unseen for this many steps is forgotten"),
          choice<C>("load_policy", &C::load_policy, LoadPolicy::none, kLoadPolicyNames,
                    "none; drop: pairs over an expert's capacity are dropped (DeepSpeed/Tutel); demote: "
                    "pairs over demotion_threshold of it move to the token's next-ranked expert under it"),
          real<C>("capacity_factor", &C::capacity_factor, 1.25, 0.01, 1e3,
                  "drop/demote: an expert's capacity is capacity_factor x pairs / experts per replica "
                  "(pairs = tokens x k of the step's layer, all ranks)"),
          real<C>("demotion_threshold", &C::demotion_threshold, 0.85, 0.01, 1e3,
                  "demote: the share of its capacity an expert keeps (its highest gate weights)"),
          real<C>("demotion_target", &C::demotion_target, 0, 0, 10,
                  "demote: > 0, each step's experts above the level that brings the step's expert loads "
                  "to this std/mean demote their excess, to candidates under the matching floor first "
                  "(instead of capacity_factor and demotion_threshold); 0 = off"),
          integer<C>("demotion_candidates", &C::demotion_candidates, 2, 1, 64,
                     "demote: next-ranked experts a demoted pair may move to (each token sends this "
                     "many more candidates in the step's gather)"),
          real<C>("bias_gamma", &C::bias_gamma, 0, 0, 1e3,
                  "online bias balancing (DeepSeek-V3): each step every expert's selection bias moves "
                  "by this toward the mean load; 0 = off"),
          flag<C>("measure_jitter", &C::measure_jitter, false,
                  "measure the routing jitter (top-k set changes under hidden-state noise 1e-4 and "
                  "1e-3, and across a request's consecutive positions): two more gate GEMMs per layer"),
      });
  return s;
}

const config::Section<WorkloadConfig>& workload_section() {
  using C = WorkloadConfig;
  static const config::Section<C> s(
      "workload", "the tokens the daemon serves without an external client",
      {
          choice<C>("kind", &C::kind, WorkloadKind::synthetic, kWorkloadKindNames,
                    "synthetic: topic-mixture tokens routed by the router; trace: routing "
                    "replayed from a trace file; ingress: model processes send their tokens "
                    "through the front door ([ingress]) until moectl shutdown"),
          integer<C>("tokens_per_step", &C::tokens_per_step, 512, 1, 1 << 24,
                     "tokens per step over all ranks (split evenly by rank)"),
          choice<C>("order", &C::order, WorkloadOrder::sequential, kWorkloadOrderNames,
                    "sequential: step s serves tokens s*T .. s*T+T-1 in order; shuffled: the same "
                    "tokens in a permutation drawn per step (dumps stay in token order)"),
          integer<C>("steps", &C::steps, 16, 1, 1 << 30, "steps to serve, then exit (synthetic and trace)"),
          integer<C>("warmup_steps", &C::warmup_steps, 1, 0, 1 << 20,
                     "steps served first and left out of the figures"),
          integer<C>("seed", &C::seed, 7, 0, INT64_MAX, "seed of the token generator"),
          real<C>("hot_ratio", &C::hot_ratio, 2.75, 1, 1e6,
                  "synthetic: load of the hottest expert over the mean (OLMoE: 2.5-3)"),
          integer<C>("topic_size", &C::topic_size, 0, 0, 65536,
                     "synthetic: experts per topic (co-routed group); 0 = 2 x top_k"),
          real<C>("cross_topic", &C::cross_topic, 0.1, 0, 1,
                  "synthetic: chance that a choice leaves the token's topic"),
          text<C>("trace", &C::trace, "", "trace: routing trace file (moed-trace v1 or JSONL)"),
          integer<C>("positions_per_request", &C::positions_per_request, 1, 1, 1 << 20,
                     "synthetic and trace: a request holds this many positions, one per step at the "
                     "same slot of consecutive steps (1: every token is its own request)"),
          real<C>("position_drift", &C::position_drift, 0.1, 0, 1,
                  "synthetic: a position is sqrt(1 - d^2) x its request's token + d x a token of its "
                  "own, so a request's consecutive positions are near-identical tokens"),
      });
  return s;
}

const config::Section<IngressConfig>& ingress_section() {
  using C = IngressConfig;
  static const config::Section<C> s(
      "ingress", "the front door: model processes on this host hand moed their MoE layers",
      {
          text<C>("dir", &C::dir, "",
                  "directory of the front-door sockets, moed-ingress-RANK.sock (mode 0600); needed "
                  "by [workload].kind = \"ingress\""),
          integer<C>("max_clients", &C::max_clients, 64, 1, 4096, "clients served at once per rank"),
          integer<C>("max_slots", &C::max_slots, 8, 1, 1024,
                     "most submits a client may have in flight (slots of shared memory)"),
          integer<C>("max_rows", &C::max_rows, 1024, 1, 1 << 20, "most rows in one submit"),
          integer<C>("max_tokens_per_step", &C::max_tokens_per_step, 4096, 1, 1 << 24,
                     "most rows a rank takes per layer per step; the rest waits for the next step"),
          integer<C>("max_wait_us", &C::max_wait_us, 100, 0, 10'000'000,
                     "once some rows are queued, wait at most this long for a layer's budget to fill"),
          integer<C>("idle_wait_us", &C::idle_wait_us, 2000, 10, 10'000'000,
                     "with no work anywhere, ranks check again after 50 us, doubling up to this: "
                     "the most delay before idle ranks pick up work"),
          integer<C>("max_client_mb", &C::max_client_mb, 256, 1, 1 << 20,
                     "slot memory per client at most (fewer slots are granted beyond it)"),
          text<C>("listen", &C::listen, "",
                  "network door: HOST:PORT addresses, comma-separated, where clients on other hosts connect "
                  "over UCX (rank r listens on PORT + r; \"*\" is every interface; port 0: any); empty: none"),
          text<C>("key_file", &C::key_file, "",
                  "the cluster's key (mode 0600, 32 to 4096 bytes) network clients must prove they hold; "
                  "needed by listen"),
          text<C>("transports", &C::transports, "",
                  "UCX transports for network clients, UCX_TLS syntax (e.g. \"tcp\"); empty: UCX's choice"),
          integer<C>("handshake_timeout_ms", &C::handshake_timeout_ms, 5000, 10, 600'000,
                     "a network client that has not logged in within this is cut off"),
          integer<C>("ping_interval_ms", &C::ping_interval_ms, 10'000, 100, 86'400'000,
                     "a network client not heard from for this long is pinged"),
          integer<C>("silence_timeout_ms", &C::silence_timeout_ms, 60'000, 100, 86'400'000,
                     "a pinged network client that answers nothing for this long is let go (its host is gone, "
                     "or it does not call the library, which connects again at its next call)"),
          integer<C>("max_handshakes", &C::max_handshakes, 64, 1, 65536,
                     "network handshakes in progress at once per rank; more connections are refused"),
          integer<C>("max_handshakes_per_peer", &C::max_handshakes_per_peer, 8, 1, 65536,
                     "network handshakes in progress at once from one address"),
      });
  return s;
}

const config::Section<ExpertsConfig>& experts_section() {
  using C = ExpertsConfig;
  static const config::Section<C> s(
      "experts", "expert computation: where, in which format, with which kernels",
      {
          choice<C>("gemm", &C::gemm, Gemm::fixed_order, kGemmNames,
                    "fixed-order: moed's GEMM, whose every output is one fma chain in k order, so a "
                    "token's bits do not depend on its batch, rank or CPU; openblas: sgemm on "
                    "canonical chunks, bit-exact across ranks and placements but not batches"),
          choice<C>("isa", &C::isa, Isa::automatic, kIsaNames,
                    "fixed-order GEMM kernel: auto = the widest this CPU runs (all give the same bits)"),
          integer<C>("chunk_rows", &C::chunk_rows, 512, 1, 1 << 20,
                     "rows per expert GEMM call; an expert's rows of a step are cut into chunks of "
                     "this size in token order, and replicas share an expert's chunks (a replicated "
                     "expert with fewer rows than this per replica is cut into one chunk per replica; "
                     "with gemm = openblas always this size, and runs compare bit for bit only with "
                     "equal values)"),
          integer<C>("blas_threads", &C::blas_threads, 1, 1, 1024,
                     "OpenBLAS threads per rank (the fixed-order GEMM runs on one thread)"),
          integer<C>("ffn_chunks", &C::ffn_chunks, 1, 1, 1 << 16,
                     "canonical chunks of an expert's F: its output is the sum of the chunks' "
                     "gate-weighted terms on the fixed grid, so an expert split into S shards "
                     "(S must divide this) gives the same bits; must divide [model].ffn; above 1, "
                     "single-expert answers travel as int64, not fp32 (part of the numerics: runs "
                     "compare bit for bit only with equal values)"),
          choice<C>("dtype", &C::dtype, "auto", {"auto", "f32", "bf16", "fp8", "mxfp4", "int8"},
                    "format experts are held and moved in (docs/weight-formats.md): auto = the checkpoint's "
                    "own; fp8 and mxfp4 come from checkpoints (or synthetic weights) in them, int8 "
                    "quantizes per output channel at load; the router stays fp32"),
          choice<C>("products", &C::products, "auto", {"auto", "f32", "bf16", "int8", "amx"},
                    "how compact experts (dtype other than f32) multiply (docs/weight-formats.md): f32 = "
                    "each weight's value times the fp32 activation; bf16 = activations rounded to bf16 and "
                    "AVX-512 BF16 dot products, about 2x faster, needs AVX-512 BF16 and VBMI on every rank; "
                    "int8 = for int8 and mxfp4 experts, activations quantized to 8 bits per row and AVX-512 "
                    "VNNI int8 products (needs VNNI and VBMI), faster again and less exact; amx = activations "
                    "rounded to bf16 in AMX tile products of 32 steps (needs AMX-BF16 on every rank), bf16's "
                    "accuracy and several times its rate at 16 rows or more; auto = amx where every rank has it, else bf16 where every rank "
                    "has it, else f32 (part of the numerics: runs compare bit for bit only with equal products); "
                    "under device = cuda: f32 (and auto) = the CPU's fp32 chains, bf16 = bf16 products on the "
                    "tensor cores (docs/gpu.md)"),
          choice<C>("device", &C::device, "cpu", {"cpu", "cuda", "auto"},
                    "where experts run (docs/gpu.md): cpu; cuda = the local rank's GPU (the CPU's bits with "
                    "products = f32; needs gemm = fixed-order), refused naming the cause where none is usable; "
                    "auto = cuda where every rank can, else cpu (not the default until the GPU path has run "
                    "on a GPU)"),
      });
  return s;
}

const config::Section<EngineConfig>& engine_section() {
  using C = EngineConfig;
  static const config::Section<C> s(
      "engine", "the step loop of a layer",
      {
          flag<C>("overlap", &C::overlap, true,
                  "experts start on the rows that have arrived (own rank first) while the rest "
                  "travel, and each source's answers leave as soon as they are complete; false = "
                  "every phase waits for the whole previous one (same bits either way)"),
          integer<C>("microbatches", &C::microbatches, 1, 1, 64,
                     "split each rank's rows of a layer into this many micro-batches, each with its "
                     "own exchanges, so that one's rows travel while another's experts run (needs "
                     "[experts].gemm = \"fixed-order\" above 1; same bits)"),
          integer<C>("split_rows", &C::split_rows, 256, 1, 1 << 24,
                     "with overlap and the fixed-order GEMM, an expert whose rows have not all arrived "
                     "runs the arrived ones early only if they are at least this many (each call reads "
                     "the expert's weights once: small early calls would read them again)"),
      });
  return s;
}

const config::Section<MetricsConfig>& metrics_section() {
  using C = MetricsConfig;
  static const config::Section<C> s(
      "metrics", "figures of the report, the Prometheus endpoint and the alerts (docs/metrics.md)",
      {
          integer<C>("load_window_steps", &C::load_window_steps, 8, 1, 1 << 20,
                     "steps in the window of the expert load spread (std/mean) and the activation rate per layer"),
          integer<C>("recent_steps", &C::recent_steps, 32, 1, 4096,
                     "steps in the recent window of tokens/s, step latency and all-to-all latency (beside "
                     "the figures since start); the latency alerts look at it"),
          integer<C>("hot_experts", &C::hot_experts, 3, 0, 64,
                     "hottest experts per layer in /metrics (their ids and load over the mean)"),
          text<C>("listen", &C::listen, "",
                  "HTTP endpoint of rank 0 serving /metrics (Prometheus text) and the dashboard at /: \"127.0.0.1:9464\", a bare "
                  "port (loopback only), or \"0.0.0.0:9464\" to listen beyond this host; port 0 = any free "
                  "port (logged); empty = off"),
          integer<C>("heatmap_columns", &C::heatmap_columns, 60, 1, 4096,
                     "columns of the dashboard's expert heatmap (a ring on rank 0: columns x layers x experts "
                     "counts, kept only with the endpoint on)"),
          integer<C>("heatmap_column_steps", &C::heatmap_column_steps, 8, 1, 1 << 20,
                     "measured steps summed into one column of the expert heatmap"),
          real<C>("alert_load_std_over_mean", &C::alert_load_std_over_mean, 0.15, 0, 1e6,
                  "alert when the expert load spread (std/mean) exceeds this; 0 = never"),
          real<C>("alert_activation_band", &C::alert_activation_band, 0.25, 0, 1e6,
                  "alert when a layer's activation rate is further than this fraction of k/E from k/E "
                  "(routing collapse or drift); 0 = never"),
          real<C>("alert_alltoall_p99_ms", &C::alert_alltoall_p99_ms, 0, 0, 1e9,
                  "alert when the recent p99 of an all-to-all wait (dispatch or combine) exceeds this many ms; "
                  "0 = never"),
          real<C>("alert_step_p99_ms", &C::alert_step_p99_ms, 0, 0, 1e9,
                  "alert when the recent step latency p99 exceeds this many ms; 0 = never"),
          real<C>("alert_for_s", &C::alert_for_s, 30, 0, 1e6,
                  "seconds a condition must hold without a break before its alert fires"),
      });
  return s;
}

const config::Section<TraceConfig>& trace_section() {
  using C = TraceConfig;
  static const config::Section<C> s(
      "trace", "single-token traces (moectl trace): every layer's experts, ranks, bytes and phase times",
      {
          real<C>("sample", &C::sample, 0.001, 0, 1,
                  "fraction of requests traced, chosen by a hash of the request id (every rank agrees); "
                  "0 = none (moectl trace --follow still traces the ids it names)"),
          integer<C>("ring", &C::ring, 256, 1, 1 << 20, "traced tokens rank 0 keeps; the oldest go first"),
          integer<C>("follow_max", &C::follow_max, 16, 1, 4096,
                     "request ids followed at once (moectl trace --follow); the oldest go first"),
      });
  return s;
}

const config::Section<AdminConfig>& admin_section() {
  using C = AdminConfig;
  static const config::Section<C> s(
      "admin", "the admin socket (moectl)",
      {
          text<C>("dir", &C::dir, "",
                  "directory of the admin sockets, moed-RANK.sock (mode 0600); empty = no socket"),
      });
  return s;
}

const config::Section<MigrationConfig>& migration_section() {
  using C = MigrationConfig;
  static const config::Section<C> s(
      "migration", "live migration of expert weights while serving",
      {
          real<C>("chunk_mb", &C::chunk_mb, 64, 0.0001, 1e6,
                  "most weight bytes a source sends per step boundary (the bandwidth cap: "
                  "chunk_mb per step)"),
          real<C>("memory_mb", &C::memory_mb, 0, 0, 1e9,
                  "expert weight memory per rank; a destination over it refuses; 0 = unlimited"),
          flag<C>("keep_window", &C::keep_window, true,
                  "keep the registered transfer window for the next migration (warm puts; costs its memory)"),
      });
  return s;
}

const config::Section<LogConfig>& log_section() {
  using C = LogConfig;
  static const config::Section<C> s(
      "log", "logging (stderr, the rank in every line)",
      {
          choice<C>("level", &C::level, "info", {std::begin(kLogLevels), std::end(kLogLevels)},
                    "log level"),
          flag<C>("per_step", &C::per_step, true, "log one line of figures per step (rank 0)"),
      });
  return s;
}

const config::Schema<Config>& schema() {
  static const config::Schema<Config> s = [] {
    config::Schema<Config> s;
    s.add(model_section(), &Config::model);
    s.add(router_section(), &Config::router);
    s.add(workload_section(), &Config::workload);
    s.add(ingress_section(), &Config::ingress);
    s.add(experts_section(), &Config::experts);
    s.add(engine_section(), &Config::engine);
    s.add(placement::cluster_config_section(), &Config::cluster);
    s.add(comm::comm_config_section(), &Config::comm);
    s.add(placement::placement_config_section(), &Config::placement);
    s.add(placement::stats_config_section(), &Config::stats);
    s.add(admin_section(), &Config::admin);
    s.add(migration_section(), &Config::migration);
    s.add(metrics_section(), &Config::metrics);
    s.add(trace_section(), &Config::trace);
    s.add(log_section(), &Config::log);
    return s;
  }();
  return s;
}

}  // namespace

Config default_config() {
  Config c = schema().defaults();
  c.model.spec = model_spec(c.model);
  return c;
}

ModelSpec model_spec(const ModelConfig& m) {
  if (!m.spec.moe_layers.empty() && std::int64_t(m.spec.moe_layers.size()) == m.layers) return m.spec;
  const Family family = m.family == "auto" || m.family.empty() ? Family::mixtral
                                                               : kFamilyNames.parse(m.family, "[model].family");
  return synthetic_spec({family, m.groups, m.groups_kept, m.shared_experts, m.dense_layers},
                        {m.layers, m.experts, m.top_k, m.hidden, m.ffn, m.norm_eps});
}

namespace {

void check_top_k(const ModelConfig& m) {
  if (m.top_k > m.experts)
    MOED_THROW(Usage, "config: [model].top_k = {} exceeds [model].experts = {}", m.top_k, m.experts);
}

// [model]'s family and spec: from config.json beside the weights (whose shape
// then fills the shape keys, which only cross-check), else from the keys.
void resolve_model(ModelConfig& m, const std::set<std::string>& given) {
  namespace fs = std::filesystem;
  const std::optional<Family> forced =
      m.family == "auto" ? std::nullopt : std::optional<Family>(kFamilyNames.parse(m.family, "[model].family"));
  std::error_code ec;
  const fs::path json_path = fs::path(m.weights) / "config.json";
  if (!m.weights.empty() && fs::is_directory(m.weights, ec) && fs::is_regular_file(json_path, ec)) {
    std::ifstream in(json_path);
    std::stringstream text;
    text << in.rdbuf();
    if (!in) MOED_THROW(Input, "{}: cannot read it", json_path.string());
    const Family* family = forced ? &*forced : nullptr;
    HfConfig hf = read_hf_config(text.str(), json_path.string(), family);
    for (const char* key : {"groups", "groups_kept", "shared_experts", "dense_layers"})
      if (given.count(key))
        MOED_THROW(Usage, "config: [model].{} is for synthetic weights; the checkpoint {} says its own in "
                   "config.json", key, m.weights);
    auto take = [&](const char* key, auto& field, auto value) {
      if (given.count(key) && field != value)
        MOED_THROW(Input, "config: [model].{} = {} disagrees with {}, which gives {}", key, field,
                   json_path.string(), value);
      field = value;
    };
    take("layers", m.layers, hf.dims.layers);
    take("experts", m.experts, hf.dims.experts);
    take("top_k", m.top_k, hf.dims.top_k);
    take("hidden", m.hidden, hf.dims.hidden);
    take("ffn", m.ffn, hf.dims.ffn);
    if (!given.count("norm_eps")) m.norm_eps = hf.dims.norm_eps;
    // The tensors' dtype, unless [model].dtype names it (each tensor is checked against it as it loads).
    if (!given.count("dtype") && (hf.torch_dtype == "bfloat16" || hf.torch_dtype == "float32"))
      m.dtype = hf.torch_dtype == "bfloat16" ? "bf16" : "f32";
    m.spec = std::move(hf.spec);
    m.checkpoint_dir = m.weights;
    m.checkpoint_experts = hf.expert_format;
    return;
  }
  // Before the spec's own checks, which would name config.json's keys.
  check_top_k(m);
  SyntheticKeys keys{forced.value_or(Family::mixtral), m.groups, m.groups_kept, m.shared_experts, m.dense_layers};
  m.spec = synthetic_spec(keys, {m.layers, m.experts, m.top_k, m.hidden, m.ffn, m.norm_eps});
  m.checkpoint_dir.clear();
  m.checkpoint_experts.clear();
}

}  // namespace

std::string experts_dtype(const Config& c) {
  if (c.experts.dtype != "auto") return c.experts.dtype;
  return c.model.checkpoint_experts.empty() ? c.model.dtype : c.model.checkpoint_experts;
}

void validate_config(const Config& c, ConfigUse use) {
  const auto& m = c.model;
  check_top_k(m);
  if (use == ConfigUse::write_weights) return;  // the rest is about serving
  if (c.router.max_k > m.experts)
    MOED_THROW(Usage, "config: [router].max_k = {} exceeds [model].experts = {}", c.router.max_k,
               m.experts);
  std::int64_t max_k = c.router.max_k ? c.router.max_k : m.top_k;
  if (c.router.mode == RouterMode::topp && c.router.min_k > max_k)
    MOED_THROW(Usage, "config: [router].min_k = {} exceeds the largest k ({} from {})",
               c.router.min_k, max_k, c.router.max_k ? "[router].max_k" : "[model].top_k");
  // A shared expert or a dense layer runs on a rank's own rows in one call: with OpenBLAS its bits would
  // depend on how many rows the rank has, so on the rank count.
  if (c.experts.gemm == Gemm::openblas && (m.spec.shared_ffn > 0 || (m.serve_dense && m.spec.dense_ffn > 0)))
    MOED_THROW(Usage, "config: [experts].gemm = \"openblas\" cannot serve {}'s {}: every rank runs it on its own "
               "rows in one call, whose bits OpenBLAS ties to the row count; use gemm = \"fixed-order\"",
               name_of(m.spec.family), m.spec.shared_ffn > 0 ? "shared expert" : "dense layers ([model].serve_dense)");
  if (c.experts.products == "int8" && experts_dtype(c) != "int8" && experts_dtype(c) != "mxfp4")
    MOED_THROW(Usage, "config: [experts].products = \"int8\" multiplies int8 and mxfp4 experts, and these are {} "
               "([experts].dtype{}); set dtype to int8 or mxfp4, or products to bf16 or f32",
               experts_dtype(c), c.experts.dtype == "auto" ? " = auto, the checkpoint's own" : "");
  if ((c.experts.products == "bf16" || c.experts.products == "amx") && experts_dtype(c) == "f32")
    MOED_THROW(Usage, "config: [experts].products = \"{}\" multiplies compact experts, and these are f32 "
               "([experts].dtype{}); set dtype to bf16, fp8, mxfp4 or int8, or products to f32", c.experts.products,
               c.experts.dtype == "auto" ? " = auto, the checkpoint's own" : "");
  if (c.experts.products != "auto" && c.experts.products != "f32" && c.experts.gemm == Gemm::openblas)
    MOED_THROW(Usage, "config: [experts].products = \"{}\" runs in moed's fixed-order GEMM; [experts].gemm = "
               "\"openblas\" multiplies in fp32", c.experts.products);
  if (c.router.mode == RouterMode::topp && m.spec.router.scoring == Scoring::sigmoid)
    MOED_THROW(Usage, "config: [router].mode = \"topp\" needs a softmax router; {}'s sigmoid scores are no "
               "probabilities to cover", name_of(m.spec.family));
  if (c.workload.kind == WorkloadKind::ingress && c.ingress.dir.empty())
    MOED_THROW(Usage, "config: [workload].kind = \"ingress\" needs [ingress].dir, the directory of the front-door sockets");
  if (!c.ingress.listen.empty() && c.workload.kind != WorkloadKind::ingress)
    MOED_THROW(Usage, "config: [ingress].listen opens the network door of the front door; it needs [workload].kind = "
               "\"ingress\"");
  if (!c.ingress.listen.empty() && c.ingress.key_file.empty())
    MOED_THROW(Usage, "config: [ingress].listen needs [ingress].key_file: network clients must prove they hold the "
               "cluster's key (e.g. head -c 32 /dev/urandom > key; chmod 600 key)");
  if (c.comm.elastic && c.workload.kind != WorkloadKind::ingress)
    MOED_THROW(Usage, "config: [comm].elastic serves the front door's clients through a lost rank; it needs "
               "[workload].kind = \"ingress\" (a built-in workload's tokens are split over the ranks at start)");
  if (c.comm.elastic && c.comm.backend != comm::Backend::ucx)
    MOED_THROW(Usage, "config: [comm].elastic needs [comm].backend = \"ucx\" (it is \"{}\"): a rank waiting in MPI "
               "cannot outlive a peer", comm::name_of(c.comm.backend));
  if (c.comm.elastic && c.comm.control != comm::ControlMedium::transport)
    MOED_THROW(Usage, "config: [comm].elastic needs [comm].control = \"transport\": MPI's collectives would wait "
               "for a lost rank forever");
  if (c.comm.spares > 0 && !c.comm.elastic)
    MOED_THROW(Usage, "config: [comm].spares = {} needs [comm].elastic = true: a spare joins the survivors of a "
               "lost rank", c.comm.spares);
  if (c.comm.lease_ms >= c.comm.timeout_ms)
    MOED_THROW(Usage, "config: [comm].lease_ms = {} must be shorter than [comm].timeout_ms = {}: past the deadline "
               "the others may have left a rank out, and it must answer nothing", c.comm.lease_ms, c.comm.timeout_ms);
  if (c.comm.join_slots > 0 && !c.comm.elastic)
    MOED_THROW(Usage, "config: [comm].join_slots = {} needs [comm].elastic = true: a joiner is admitted as the "
               "survivors of a loss admit a spare", c.comm.join_slots);
  if (c.comm.join_slots > 0 && c.comm.join_listen.empty())
    MOED_THROW(Usage, "config: [comm].join_slots = {} needs [comm].join_listen, the HOST:PORT where rank 0 hears "
               "`moed --join`", c.comm.join_slots);
  if (!c.comm.join_listen.empty() && c.comm.join_slots == 0)
    MOED_THROW(Usage, "config: [comm].join_listen is set but [comm].join_slots = 0: no joiner could be admitted");
  if (c.comm.join_slots > 0 && c.ingress.key_file.empty())
    MOED_THROW(Usage, "config: [comm].join_slots needs [ingress].key_file: a joiner proves it holds the cluster's "
               "key before it is given a rank");
  if (c.comm.join_slots > 0 && c.comm.spares > 0)
    MOED_THROW(Usage, "config: [comm].join_slots and [comm].spares together: a spare waiting outside the members "
               "would never learn a joiner's address; choose one");
  if (!c.comm.join_listen.empty()) parse_listen_address(c.comm.join_listen, "[comm].join_listen");
  if (c.workload.kind == WorkloadKind::trace && c.workload.trace.empty())
    MOED_THROW(Usage, "config: [workload].kind = \"trace\" needs [workload].trace, a trace file");
  if (c.workload.kind == WorkloadKind::synthetic && double(c.workload.hot_ratio) * double(m.top_k) > double(m.experts))
    MOED_THROW(Usage,
               "config: [workload].hot_ratio = {} is unreachable: the hottest expert can carry at "
               "most every token, {} = [model].experts / [model].top_k times the mean",
               c.workload.hot_ratio, double(m.experts) / double(m.top_k));
  if (m.ffn % c.experts.ffn_chunks != 0)
    MOED_THROW(Usage, "config: [experts].ffn_chunks = {} does not divide [model].ffn = {}", c.experts.ffn_chunks,
               m.ffn);
  if (c.placement.shard_over_mean > 0 && c.experts.ffn_chunks % c.placement.shards != 0)
    MOED_THROW(Usage,
               "config: [placement].shard_over_mean splits experts into [placement].shards = {} shards, which "
               "must divide [experts].ffn_chunks = {} (each shard holds whole canonical chunks)",
               c.placement.shards, c.experts.ffn_chunks);
  if (c.placement.shard_over_mean > 0 && c.experts.gemm != Gemm::fixed_order)
    MOED_THROW(Usage, "config: [placement].shard_over_mean needs [experts].gemm = \"fixed-order\" (a shard's bits "
                      "are the whole expert's only with it; it is \"{}\")",
               name_of(c.experts.gemm));
  if (c.engine.microbatches > 1 && c.experts.gemm != Gemm::fixed_order)
    MOED_THROW(Usage,
               "config: [engine].microbatches = {} needs [experts].gemm = \"fixed-order\": with \"{}\" a "
               "row's bits depend on the chunk it is computed in, and micro-batches change the chunks",
               c.engine.microbatches, name_of(c.experts.gemm));
  if (!c.metrics.listen.empty()) parse_listen_address(c.metrics.listen, "config: [metrics].listen");
  const RouterConfig& r = c.router;
  if (c.workload.kind == WorkloadKind::trace &&
      (r.smoothing_beta > 0 || r.bias_gamma > 0 || r.load_policy == LoadPolicy::demote || r.measure_jitter))
    MOED_THROW(Usage,
               "config: [workload].kind = \"trace\" replays routing without logits, so [router].{} cannot "
               "apply (only load_policy = \"drop\" can)",
               r.smoothing_beta > 0 ? "smoothing_beta" : r.bias_gamma > 0 ? "bias_gamma"
               : r.measure_jitter ? "measure_jitter" : "load_policy = \"demote\"");
  if (c.workload.topic_size > m.experts)
    MOED_THROW(Usage, "config: [workload].topic_size = {} exceeds [model].experts = {}",
               c.workload.topic_size, m.experts);
}

Config load_config_text(const std::string& toml_text, const std::string& origin,
                        const std::vector<std::string>& overrides, ConfigUse use) {
  Config c = schema().defaults();
  std::set<std::string> model_keys_given;
  if (!toml_text.empty()) {
    toml::table table = config::detail::parse_toml(toml_text, origin);
    if (const toml::table* model = table["model"].as_table())
      for (const auto& [key, node] : *model) model_keys_given.emplace(key.str());
    schema().load(table, c, origin);
  }
  for (const auto& o : overrides) {
    schema().set(c, o);
    if (o.rfind("model.", 0) == 0) model_keys_given.insert(o.substr(6, o.find('=') - 6));
  }
  resolve_model(c.model, model_keys_given);
  validate_config(c, use);
  return c;
}

Config load_config(const std::string& path, const std::vector<std::string>& overrides, ConfigUse use) {
  std::string text;
  if (!path.empty()) {
    // A directory opens as a stream that reads nothing: it would load as
    // the defaults, silently.
    std::error_code ec;
    if (std::filesystem::is_directory(path, ec))
      MOED_THROW(Usage, "config: {} is a directory, not a config file", path);
    std::ifstream in(path);
    if (!in) MOED_THROW(Usage, "config: cannot open {}", path);
    std::stringstream ss;
    ss << in.rdbuf();
    if (in.bad()) MOED_THROW(Usage, "config: cannot read {}", path);
    text = ss.str();
  }
  return load_config_text(text, path.empty() ? "defaults" : path, overrides, use);
}

void print_config(std::ostream& os, const Config& c) {
  os << "# moed effective configuration: every key with its doc, allowed values and default.\n"
        "# Load it back with: moed --config FILE\n";
  schema().print(os, c);
}

}  // namespace moed::runtime
