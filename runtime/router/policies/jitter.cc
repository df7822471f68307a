#include "runtime/router/policies/jitter.h"

#include "common/error.h"
#include "common/rng.h"
#include "runtime/router/policies/request_history.h"

namespace moed::runtime {

void perturb_rows(const float* x, std::size_t rows, std::size_t hidden, const std::uint64_t* keys, int layer,
                  double eps, float* out) {
  for (std::size_t t = 0; t < rows; ++t) {
    const CounterRng noise(hash_combine(hash_combine(0x6a177e5ull, keys[t]), std::uint64_t(layer)));
    for (std::size_t i = 0; i < hidden; ++i)
      out[t * hidden + i] = float(double(x[t * hidden + i]) * (1.0 + eps * double(noise.normalish(i))));
  }
}

std::uint64_t changed_choices(const Ranked& a, const Ranked& b) {
  MOED_CHECK(a.tokens() == b.tokens(), "jitter: {} tokens against {}", a.tokens(), b.tokens());
  std::uint64_t changed = 0;
  for (std::size_t t = 0; t < a.tokens(); ++t)
    changed += !same_experts(a.experts_of(t).first(a.chosen[t]), b.experts_of(t).first(b.chosen[t]));
  return changed;
}

}  // namespace moed::runtime
