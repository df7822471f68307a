#include "runtime/memory_estimate.h"

#include <fmt/format.h>

#include <algorithm>
#include <limits>
#include <optional>

#include "common/error.h"
#include "runtime/weights/safetensors_format.h"

namespace moed::runtime {

namespace {

constexpr std::uint64_t kMax = std::numeric_limits<std::uint64_t>::max();
constexpr std::uint64_t kF32 = sizeof(float);
// Rows per expert call at most (ExpertExecutor's block): its scratch is sized for them.
constexpr std::uint64_t kCallRows = 256;

// Saturating product and sum: sizes near the config's limits overflow 64 bits.
std::uint64_t mul(std::initializer_list<std::uint64_t> factors) {
  std::uint64_t out = 1;
  for (std::uint64_t f : factors)
    if (__builtin_mul_overflow(out, f, &out)) return kMax;
  return out;
}
std::uint64_t add(std::uint64_t a, std::uint64_t b) { return a > kMax - b ? kMax : a + b; }

struct Sizes {
  std::uint64_t L, E, H, F, k;
};
Sizes sizes_of(const Config& c) {
  const std::int64_t k = c.router.mode == "topp" && c.router.max_k ? c.router.max_k : c.model.top_k;
  return {std::uint64_t(c.model.layers), std::uint64_t(c.model.experts), std::uint64_t(c.model.hidden),
          std::uint64_t(c.model.ffn), std::uint64_t(k)};
}

}  // namespace

std::uint64_t MemoryEstimate::total() const {
  std::uint64_t sum = 0;
  for (const MemoryPart& p : parts) sum = add(sum, p.bytes);
  return sum;
}

MemoryEstimate estimate_rank_memory(const Config& c, std::uint64_t slots, int ranks) {
  const auto [L, E, H, F, k] = sizes_of(c);
  const bool ingress = c.workload.kind == "ingress";
  const std::uint64_t job_tokens =
      std::uint64_t(ingress ? c.ingress.max_tokens_per_step : c.workload.tokens_per_step);
  // The workload's tokens are the job's, split over the ranks; the front door's budget is per rank.
  const std::uint64_t tokens = ingress ? job_tokens : (job_tokens + std::uint64_t(ranks) - 1) / std::uint64_t(ranks);
  const char* tokens_key = ingress ? "[ingress].max_tokens_per_step" : "[workload].tokens_per_step";
  MemoryEstimate e;
  // Each slot's W1|W3 and W2; one more while a slot is packed at load.
  const std::uint64_t slot = mul({3, H, F, kF32});
  const bool packing = c.experts.gemm == "fixed-order" && slots;
  const std::uint64_t held = slots + (packing ? 1 : 0);
  e.parts.push_back({fmt::format("expert weights: {} slots{} x 3 x [model].hidden {} x [model].ffn {} x 4 bytes", slots,
                                 packing ? " (+1 while one is packed at load)" : "", H, F),
                     "[model].hidden, [model].ffn, or the slots per rank ([model].experts x [model].layers, "
                     "spread over more ranks)",
                     mul({held, slot})});
  // The gate as loaded and packed for the router, the norms, the workload's directions.
  e.parts.push_back({fmt::format("gates: 2 x [model].layers {} x [model].experts {} x [model].hidden {} x 4 bytes",
                                 L, E, H),
                     "[model].layers, [model].experts, [model].hidden",
                     add(mul({2, L, E, H, kF32}), add(mul({L, H, kF32}), mul({E, H, kF32})))});
  // Per local token: its row, normalised row, output and fixed-point sum;
  // per pair: the row sent and received, the answer sent and received.
  const std::uint64_t per_token = add(mul({H, 4 + 4 + 4 + 8}), mul({E, kF32}));
  const std::uint64_t per_pair = mul({2, H, 4 + 8});
  e.parts.push_back({fmt::format("step buffers: {} tokens per rank x [model].hidden {} (rows, sums, and {} "
                                 "experts per token's rows and answers)",
                                 tokens, H, k),
                     fmt::format("{}, [model].hidden, [model].top_k", tokens_key),
                     add(mul({tokens, per_token}), mul({tokens, k, per_pair}))});
  // The rows of one expert call, their outputs, and the FFN's [rows, 2F] scratch.
  const std::uint64_t call_rows = std::min(kCallRows, std::max<std::uint64_t>(1, mul({tokens, k})));
  e.parts.push_back({fmt::format("expert call scratch: {} rows x (2 x [model].ffn {} + 2 x [model].hidden {}) x 4 "
                                 "bytes",
                                 call_rows, F, H),
                     fmt::format("[model].ffn, [model].hidden, {}", tokens_key),
                     mul({call_rows, add(mul({2, F}), mul({2, H})), kF32})});
  return e;
}

MemoryEstimate estimate_generate_memory(const Config& c) {
  const auto [L, E, H, F, k] = sizes_of(c);
  const std::uint64_t element = weights::element_size(*weights::parse_dtype(c.model.dtype));
  MemoryEstimate e;
  e.parts.push_back({fmt::format("expert tensors: [model].layers {} x [model].experts {} x 3 x [model].hidden {} x "
                                 "[model].ffn {} x {} bytes ([model].dtype)",
                                 L, E, H, F, element),
                     "[model].hidden, [model].ffn, [model].experts, [model].layers", mul({L, E, 3, H, F, element})});
  e.parts.push_back({fmt::format("gates: [model].layers {} x [model].experts {} x [model].hidden {}", L, E, H),
                     "[model].layers, [model].experts, [model].hidden",
                     add(mul({L, add(mul({E, H}), H), element}), mul({E, H, kF32}))});
  // One tensor at a time is made in fp32 before it is converted.
  e.parts.push_back({fmt::format("one tensor in fp32: [model].hidden {} x [model].ffn {} x 4 bytes", H, F),
                     "[model].hidden, [model].ffn", std::max(mul({H, F, kF32}), mul({E, H, kF32}))});
  return e;
}

void check_memory_fits(const MemoryEstimate& estimate, int copies, const AvailableMemory& available,
                       const std::string& who) {
  const std::uint64_t one = estimate.total(), needed = mul({one, std::uint64_t(copies)});
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
