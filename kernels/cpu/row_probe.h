// The start-up probes' common loop (quant_weights.h, bf16_dot_gemm.h,
// int8_dot_gemm.h): a row among random rows, at every position of batches
// around the tile sizes and the row blocking, must give `want`, its bits
// alone by the definition.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "common/rng.h"
#include "kernels/cpu/encoded_matrix.h"
#include "kernels/cpu/fixed_order_gemm.h"
#include "kernels/cpu/quant_weights.h"

namespace moed::kernels::detail {

// Random values in [-1, 1), a fresh run of them per call, keyed by `name`.
class ProbeValues {
 public:
  explicit ProbeValues(const std::string& name) : rng_(hash_name(name)) {}
  std::vector<float> operator()(std::size_t count) {
    std::vector<float> v(count);
    for (float& x : v) x = rng_.symmetric(counter_++);
    return v;
  }

 private:
  CounterRng rng_;
  std::uint64_t counter_ = 0;
};

// gemm(a, m, c) computes C[m, n] for A[m, k]; `what` names the kernel in the
// failure ("... differs from <what>").
template <class Gemm>
InvarianceProbe probe_row_positions(ProbeValues& random, const std::vector<float>& row, const std::vector<float>& want,
                                    Gemm&& gemm, const std::string& what) {
  const std::size_t k = row.size(), n = want.size();
  for (std::size_t m : {1, 2, 5, 12, 13, 31, 145}) {
    std::vector<float> a = random(m * k), c(m * n);
    for (std::size_t pos = 0; pos < m; pos += (m > 16 ? 7 : 1)) {
      std::vector<float> batch = a;
      std::memcpy(batch.data() + pos * k, row.data(), k * sizeof(float));
      gemm(batch.data(), m, c.data());
      if (std::memcmp(c.data() + pos * n, want.data(), n * sizeof(float)) != 0)
        return {false, "a row at position " + std::to_string(pos) + " of " + std::to_string(m) + " rows differs from " +
                           what + " (n " + std::to_string(n) + " k " + std::to_string(k) + ")"};
    }
  }
  return {true, ""};
}

// The probe of a GEMM over compact weights with kernels of its own:
// run(kernels, a, m, w, c) computes C[m, n] over all of k; the portable
// kernels on a row alone are the bits every position must give with the
// kernels here. `name` keys the random values; `what` names the portable
// loops in a failure.
template <class Kernels, class Run>
InvarianceProbe probe_kernels(const std::string& name, WeightDtype dtype, std::size_t n, std::size_t k,
                              const Kernels& portable, const Kernels& here, Run&& run, const std::string& what) {
  ProbeValues random(name);
  const QuantWeights w(encode(dtype, random(n * k).data(), n, k));
  const std::vector<float> row = random(k);
  std::vector<float> want(n);
  run(portable, row.data(), 1, w, want.data());
  return probe_row_positions(
      random, row, want, [&](const float* a, std::size_t m, float* c) { run(here, a, m, w, c); }, what);
}

}  // namespace moed::kernels::detail
