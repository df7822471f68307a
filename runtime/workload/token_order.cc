#include "runtime/workload/token_order.h"

#include <numeric>
#include <utility>

#include "common/rng.h"

namespace moed::runtime {

TokenTag request_of_token(std::uint64_t id, std::uint64_t tokens_per_step, std::uint64_t positions_per_request) {
  const std::uint64_t step = id / tokens_per_step, slot = id % tokens_per_step;
  return {step / positions_per_request * tokens_per_step + slot, std::uint32_t(step % positions_per_request)};
}

std::uint64_t last_step_of_request(std::uint64_t request, std::uint64_t tokens_per_step,
                                   std::uint64_t positions_per_request) {
  return request / tokens_per_step * positions_per_request + positions_per_request - 1;
}

TokenOrder::TokenOrder(std::uint64_t tokens_per_step, bool shuffled, std::uint64_t seed)
    : tokens_per_step_(tokens_per_step), shuffled_(shuffled), seed_(seed) {}

void TokenOrder::permutation(std::uint64_t step, std::vector<std::uint32_t>& out) const {
  out.resize(tokens_per_step_);
  std::iota(out.begin(), out.end(), 0u);
  if (!shuffled_) return;
  // Fisher-Yates from a counter-based generator: every rank draws the same.
  const CounterRng rng(hash_combine(hash_combine(seed_, hash_name("token-order")), step));
  for (std::uint64_t i = tokens_per_step_; i > 1; --i) {
    const std::uint64_t j = rng.bits(i) % i;
    std::swap(out[i - 1], out[j]);
  }
}

void TokenOrder::ids(std::uint64_t step, std::uint64_t first, std::size_t count,
                     std::vector<std::uint64_t>& out) const {
  out.resize(count);
  const std::uint64_t base = step * tokens_per_step_;
  if (!shuffled_) {
    std::iota(out.begin(), out.end(), base + first);
    return;
  }
  std::vector<std::uint32_t> perm;
  permutation(step, perm);
  for (std::size_t i = 0; i < count; ++i) out[i] = base + perm[first + i];
}

void TokenOrder::positions(std::uint64_t step, std::vector<std::uint32_t>& out) const {
  std::vector<std::uint32_t> perm;
  permutation(step, perm);
  out.resize(perm.size());
  for (std::uint32_t p = 0; p < perm.size(); ++p) out[perm[p]] = p;
}

}  // namespace moed::runtime
