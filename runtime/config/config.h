// The daemon's whole configuration: one struct per TOML section, each
// declared once with defaults and docs (runtime's own sections in config.cc,
// the others beside the part they configure), composed into one Schema.
#pragma once

#include <cstdint>
#include <iosfwd>
#include <string>
#include <string_view>
#include <vector>

#include "common/layer_numbers.h"
#include "comm/comm_config.h"
#include "common/config_table.h"
#include "placement/placement_config.h"
#include "runtime/config/model_family.h"

namespace moed::runtime {

// The keys with a fixed set of values, each with its names (as configs spell them).
enum class RouterMode { topk, topp };
inline constexpr auto kRouterModeNames = config::name_table<RouterMode>({{RouterMode::topk, "topk"},
                                                                         {RouterMode::topp, "topp"}});
enum class LoadPolicy { none, drop, demote };  // runtime/router/policies/load_policy.h
inline constexpr auto kLoadPolicyNames = config::name_table<LoadPolicy>(
    {{LoadPolicy::none, "none"}, {LoadPolicy::drop, "drop"}, {LoadPolicy::demote, "demote"}});
enum class WorkloadKind { synthetic, trace, ingress };
inline constexpr auto kWorkloadKindNames = config::name_table<WorkloadKind>(
    {{WorkloadKind::synthetic, "synthetic"}, {WorkloadKind::trace, "trace"}, {WorkloadKind::ingress, "ingress"}});
enum class WorkloadOrder { sequential, shuffled };
inline constexpr auto kWorkloadOrderNames = config::name_table<WorkloadOrder>(
    {{WorkloadOrder::sequential, "sequential"}, {WorkloadOrder::shuffled, "shuffled"}});
enum class Gemm { fixed_order, openblas };
inline constexpr auto kGemmNames = config::name_table<Gemm>({{Gemm::fixed_order, "fixed-order"},
                                                             {Gemm::openblas, "openblas"}});
enum class Isa { automatic, avx512, avx2, portable };  // the fixed-order GEMM's kernel (kernels::GemmIsa)
inline constexpr auto kIsaNames = config::name_table<Isa>(
    {{Isa::automatic, "auto"}, {Isa::avx512, "avx512"}, {Isa::avx2, "avx2"}, {Isa::portable, "portable"}});

inline std::string_view name_of(RouterMode v) { return kRouterModeNames.name(v); }
inline std::string_view name_of(LoadPolicy v) { return kLoadPolicyNames.name(v); }
inline std::string_view name_of(WorkloadKind v) { return kWorkloadKindNames.name(v); }
inline std::string_view name_of(WorkloadOrder v) { return kWorkloadOrderNames.name(v); }
inline std::string_view name_of(Gemm v) { return kGemmNames.name(v); }
inline std::string_view name_of(Isa v) { return kIsaNames.name(v); }

struct ModelConfig {
  std::int64_t layers = 0, experts = 0, top_k = 0, hidden = 0, ffn = 0;
  std::string dtype;
  std::string weights;
  bool check_finite = true;
  std::int64_t seed = 0;
  double norm_eps = 0;
  std::string family;  // "auto" or a Family's name
  std::int64_t groups = 0, groups_kept = 0, shared_experts = -1, dense_layers = 0;
  bool serve_dense = false;
  // Resolved by load_config: the checkpoint's config.json (when [model].weights
  // is a directory holding one) or the keys above; the shape keys then hold
  // the checkpoint's shape.
  ModelSpec spec;
  // The directory holding config.json ("" for synthetic weights or a bare file).
  std::string checkpoint_dir;
  // The format the checkpoint ships its experts in, from config.json's
  // quantization_config ("fp8", "mxfp4"); "" when they are plain [model].dtype.
  std::string checkpoint_experts;
};

struct RouterConfig {
  RouterMode mode = RouterMode::topk;
  double temperature = 1;
  double top_p = 1;
  std::int64_t min_k = 1, max_k = 0;
  // Policies (docs/router-policies.md); each is off by default.
  double smoothing_beta = 0;
  std::int64_t smoothing_max_requests = 0, smoothing_idle_steps = 0;
  LoadPolicy load_policy = LoadPolicy::none;
  double capacity_factor = 1, demotion_threshold = 1, demotion_target = 0;
  std::int64_t demotion_candidates = 0;
  double bias_gamma = 0;
  bool measure_jitter = false;
};

struct WorkloadConfig {
  WorkloadKind kind = WorkloadKind::synthetic;
  WorkloadOrder order = WorkloadOrder::sequential;
  std::int64_t tokens_per_step = 0, steps = 0, warmup_steps = 0, seed = 0;
  double hot_ratio = 0;
  std::int64_t topic_size = 0;
  double cross_topic = 0;
  std::string trace;
  std::int64_t positions_per_request = 1;
  double position_drift = 0;
};

struct IngressConfig {
  std::string dir;
  std::int64_t max_clients = 0, max_slots = 0, max_rows = 0, max_tokens_per_step = 0;
  std::int64_t max_wait_us = 0, idle_wait_us = 0, max_client_mb = 0;
  std::string listen, key_file, transports;  // the network door
  std::int64_t handshake_timeout_ms = 0, ping_interval_ms = 0, silence_timeout_ms = 0;
  std::int64_t max_handshakes = 0, max_handshakes_per_peer = 0;
};

struct ExpertsConfig {
  Gemm gemm = Gemm::fixed_order;
  Isa isa = Isa::automatic;
  std::int64_t chunk_rows = 0, blas_threads = 1;
  std::int64_t ffn_chunks = 1;
  std::string dtype = "auto";  // "auto" or a kernels::WeightDtype's name
  std::string products = "auto";  // "auto", "f32" or "bf16" (kernels::CompactProducts)
  std::string device = "cpu";     // "cpu", "cuda" or "auto" (runtime/engine/expert_device.h)
};

struct EngineConfig {
  bool overlap = true;
  std::int64_t microbatches = 1;
  std::int64_t split_rows = 256;
};

struct MetricsConfig {
  std::int64_t load_window_steps = 0, recent_steps = 0, hot_experts = 0;
  std::int64_t heatmap_columns = 0, heatmap_column_steps = 0;  // the dashboard's expert heatmap
  std::string listen;  // empty: no HTTP endpoint
  double alert_load_std_over_mean = 0, alert_activation_band = 0;
  double alert_alltoall_p99_ms = 0, alert_step_p99_ms = 0;
  double alert_for_s = 0;
};

struct TraceConfig {
  double sample = 0;
  std::int64_t ring = 0;
  std::int64_t follow_max = 0;
};

struct AdminConfig {
  std::string dir;
};

struct MigrationConfig {
  double chunk_mb = 0;
  double memory_mb = 0;
  bool keep_window = true;
};

struct LogConfig {
  std::string level;
  bool per_step = true;
};

struct Config {
  ModelConfig model;
  RouterConfig router;
  WorkloadConfig workload;
  IngressConfig ingress;
  ExpertsConfig experts;
  EngineConfig engine;
  placement::ClusterConfig cluster;
  comm::CommConfig comm;
  placement::PlacementConfig placement;
  placement::StatsConfig stats;
  AdminConfig admin;
  MigrationConfig migration;
  MetricsConfig metrics;
  TraceConfig trace;
  LogConfig log;
};

// What a config is loaded for. Serving checks every key against the others;
// writing weights (moed --generate-weights) checks only what the weights
// need, the model's shape, so that a key of the workload or the engine
// (say [workload].hot_ratio at a larger top_k) does not refuse it.
enum class ConfigUse { serve, write_weights };

// Every key at its default: the embedded default config (the demo's).
Config default_config();
// Defaults, then the TOML file (if any), then each "section.key=value" in order;
// then the checks that span keys (those `use` needs). Usage errors name the key.
Config load_config(const std::string& path, const std::vector<std::string>& overrides,
                   ConfigUse use = ConfigUse::serve);
Config load_config_text(const std::string& toml_text, const std::string& origin,
                        const std::vector<std::string>& overrides, ConfigUse use = ConfigUse::serve);
// The model's spec: the one load_config resolved, or (a Config assembled in
// code, whose keys changed after) the synthetic spec of [model]'s keys.
ModelSpec model_spec(const ModelConfig& m);
// The model layer numbers of the MoE layers served (common/layer_numbers.h).
inline LayerNumbers layer_numbers(const ModelConfig& m) { return LayerNumbers(model_spec(m).moe_layers); }
// Checks between keys (top_k <= experts, ...); load_config calls it.
void validate_config(const Config& c, ConfigUse use = ConfigUse::serve);
// The format experts are held in: [experts].dtype, or for "auto" the
// checkpoint's own (its quantization_config's, else [model].dtype).
std::string experts_dtype(const Config& c);
// TOML with each key's doc, allowed values and default as comments.
void print_config(std::ostream& os, const Config& c);

}  // namespace moed::runtime
