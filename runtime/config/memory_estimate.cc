#include "runtime/config/memory_estimate.h"

#include <fmt/format.h>

#include <algorithm>
#include <limits>
#include <optional>

#include "common/error.h"
#include "common/saturating.h"
#include "placement/weight_format.h"

namespace moed::runtime {

namespace {

using placement::RankMemoryInputs;
constexpr std::uint64_t kF32 = sizeof(float);

struct Sizes {
  std::uint64_t L, E, H, F, k;
};
Sizes sizes_of(const Config& c) {
  const std::int64_t k = c.router.mode == RouterMode::topp && c.router.max_k ? c.router.max_k : c.model.top_k;
  return {std::uint64_t(c.model.layers), std::uint64_t(c.model.experts), std::uint64_t(c.model.hidden),
          std::uint64_t(c.model.ffn), std::uint64_t(k)};
}

}  // namespace

RankMemoryInputs rank_memory_inputs(const Config& c, std::uint64_t slots, int ranks, int rank) {
  return rank_memory_inputs(c, std::vector<placement::SlotGroup>{{slots, 1}}, ranks, rank);
}

RankMemoryInputs rank_memory_inputs(const Config& c, std::vector<placement::SlotGroup> slots, int ranks, int rank) {
  const auto [L, E, H, F, k] = sizes_of(c);
  const bool ingress = c.workload.kind == WorkloadKind::ingress;
  const auto R = std::uint64_t(ranks);
  RankMemoryInputs in;
  in.layers = L, in.experts = E, in.hidden = H, in.ffn = F, in.max_k = k;
  const ModelSpec spec = model_spec(c.model);
  in.expert_bias = spec.expert.biases;
  in.shared_ffn = std::uint64_t(spec.shared_ffn);
  if (c.model.serve_dense) in.dense_layers = spec.dense_layers().size(), in.dense_ffn = std::uint64_t(spec.dense_ffn);
  // The CPU path holds and moves experts in [experts].dtype.
  in.expert_format = placement::weight_format(experts_dtype(c), "[experts].dtype");
  in.slots = std::move(slots);
  in.pack_at_load = c.experts.gemm == Gemm::fixed_order;
  in.cpu_router = true;
  // The workload's tokens are the job's, split over the ranks; the front door's budget is per rank.
  in.tokens = ingress ? std::uint64_t(c.ingress.max_tokens_per_step)
                      : (std::uint64_t(c.workload.tokens_per_step) + R - 1) / R;
  in.ranks = R;
  in.tokens_key = ingress ? "[ingress].max_tokens_per_step" : "[workload].tokens_per_step";
  in.keep_window = c.migration.keep_window;
  in.maps_peer_windows = true;  // the CPU path serves from one host here
  // As the daemon keeps them: with a stats file or an admin socket.
  in.stats = !c.stats.file.empty() || !c.admin.dir.empty();
  in.stats_sample_tokens = (std::uint64_t(c.stats.sample_tokens) + R - 1) / R;
  in.gathers_stats = in.stats && rank == 0;
  in.gathered_sample_tokens = std::uint64_t(c.stats.sample_tokens);
  in.load_window_steps = rank == 0 ? std::uint64_t(c.metrics.load_window_steps) : 0;
  return in;
}

std::uint64_t cpu_process_overhead_bytes() {
  // VmRSS after load of a rank serving tests/mpi/small.toml (3 x 8 experts
  // of 64 x 96: the model is 0.2 MB), 2 ranks over UCX on Debian 12: 29 MiB.
  return std::uint64_t(29) << 20;
}

MemoryEstimate estimate_rank_memory(const Config& c, std::uint64_t slots, int ranks, int rank) {
  return placement::rank_memory(rank_memory_inputs(c, slots, ranks, rank));
}

MemoryEstimate estimate_rank_memory(const Config& c, std::vector<placement::SlotGroup> slots, int ranks, int rank) {
  return placement::rank_memory(rank_memory_inputs(c, std::move(slots), ranks, rank));
}

MemoryEstimate estimate_device_memory(const Config& c, std::vector<placement::SlotGroup> slots, int ranks, int rank) {
  const RankMemoryInputs in = rank_memory_inputs(c, std::move(slots), ranks, rank);
  const MemoryEstimate host = placement::rank_memory(in);
  MemoryEstimate e;
  // The held weights, as the host holds them, less the copy a slot is packed from.
  for (const MemoryPart& p : host.parts)
    if (p.group == "expert slots" && p.what.rfind("packing at load", 0) != 0) e.parts.push_back(p);
  const auto [L, E, H, F, k] = sizes_of(c);
  constexpr std::uint64_t kExecutors = 2, kBlockRows = 256;  // the routed and the held FFNs' (runtime/engine)
  e.parts.push_back({fmt::format("GPU executors' block buffers: {} x {} rows x (2 x [model].hidden {} + 2 x "
                                 "[model].ffn {}) x 4 bytes",
                                 kExecutors, kBlockRows, H, F),
                     "[model].hidden, [model].ffn",
                     saturating_mul({kExecutors, kBlockRows, saturating_add(saturating_mul(2, H), saturating_mul(2, F)),
                                     std::uint64_t(4)}),
                     "dispatch and combine"});
  // The route stage's weights, every layer's, copied at start (runtime/engine/cuda_router.h).
  e.parts.push_back({fmt::format("router on the GPU: [model].layers {} x ([model].experts {} x [model].hidden {} + "
                                 "[model].hidden + 2 x [model].experts) x 4 bytes (gate, norm, biases)",
                                 L, E, H),
                     "[model].layers, [model].experts, [model].hidden",
                     saturating_mul({L, saturating_add(saturating_add(saturating_mul(E, H), H), saturating_mul(2, E)),
                                     kF32}),
                     "router and norm"});
  // Its step buffers: a layer's rows in and normalised, logits, ids and weights, counts.
  e.parts.push_back({fmt::format("router's step buffers on the GPU: {} tokens ({}) x (2 x [model].hidden {} + "
                                 "[model].experts {} + 2 x k {} + 1) x 4 bytes",
                                 in.tokens, in.tokens_key, H, E, k),
                     in.tokens_key + ", [model].hidden, [model].experts",
                     saturating_mul({in.tokens,
                                     saturating_add(saturating_add(saturating_mul(2, H), E), saturating_add(saturating_mul(2, k), 1)),
                                     kF32}),
                     "dispatch and combine"});
  return e;
}

MemoryEstimate estimate_generate_memory(const Config& c) {
  const auto [L, E, H, F, k] = sizes_of(c);
  const std::uint64_t element = placement::weight_format(c.model.dtype, "[model].dtype").block_bytes;
  MemoryEstimate e;
  e.parts.push_back({fmt::format("expert tensors: [model].layers {} x [model].experts {} x 3 x [model].hidden {} x "
                                 "[model].ffn {} x {} bytes ([model].dtype)",
                                 L, E, H, F, element),
                     "[model].hidden, [model].ffn, [model].experts, [model].layers",
                     saturating_mul({L, E, 3, H, F, element}), "expert slots"});
  e.parts.push_back({fmt::format("gates: [model].layers {} x [model].experts {} x [model].hidden {}", L, E, H),
                     "[model].layers, [model].experts, [model].hidden",
                     saturating_add(saturating_mul({L, saturating_add(saturating_mul({E, H}), H), element}), saturating_mul({E, H, kF32})),
                     "router and norm"});
  // One tensor at a time is made in fp32 before it is converted.
  e.parts.push_back({fmt::format("one tensor in fp32: [model].hidden {} x [model].ffn {} x 4 bytes", H, F),
                     "[model].hidden, [model].ffn",
                     std::max(saturating_mul({H, F, kF32}), saturating_mul({E, H, kF32})), "dispatch and combine"});
  return e;
}

void check_memory_fits(const MemoryEstimate& estimate, int copies, const AvailableMemory& available,
                       const std::string& who) {
  const std::uint64_t one = estimate.total(), needed = saturating_mul({one, std::uint64_t(copies)});
  if (needed <= available.bytes) return;
  std::vector<const MemoryPart*> parts;
  for (const MemoryPart& p : estimate.parts) parts.push_back(&p);
  std::stable_sort(parts.begin(), parts.end(), [](auto* a, auto* b) { return a->bytes > b->bytes; });
  // The parts that matter: the largest, and any other of at least a tenth of the total.
  std::string detail, keys;
  for (const MemoryPart* p : parts) {
    if (p != parts.front() && p->bytes < one / 10) continue;
    detail += fmt::format("; {} = {} bytes ({})", p->what, p->bytes, human_bytes(p->bytes));
    keys += fmt::format("{}{}", keys.empty() ? "" : "; or ", p->keys);
  }
  const std::string sharing =
      copies > 1 ? fmt::format(", x {} ranks on this host = {} bytes ({})", copies, needed, human_bytes(needed)) : "";
  MOED_THROW(Usage, "memory: {} needs about {} bytes ({}){}, more than the {} bytes ({}) available ({}){}. Lower {}",
             who, one, human_bytes(one), sharing, available.bytes, human_bytes(available.bytes), available.source,
             detail, keys);
}

}  // namespace moed::runtime

namespace moed::runtime {

void refuse_if_too_large(const MemoryEstimate& estimate, int copies, const std::string& who) {
  if (const std::optional<AvailableMemory> available = available_memory())
    check_memory_fits(estimate, copies, *available, who);
}

}  // namespace moed::runtime
