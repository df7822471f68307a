// The synthetic workload's loops: per-coordinate noise, x[i] += factor *
// CounterRng(key).normalish(i), and its scaled directions, x[i] += factor *
// d[i]; written once and compiled into each instruction set's file
// (normalish.cc portable, normalish_avx2.cc, normalish_avx512.cc, the last
// with AVX-512 DQ for 64-bit multiplies), like silu_body.h. The integer mixing is exact and
// every float step is one IEEE operation (no contraction: those files build
// with -ffp-contract=off), so every width gives the scalar loop's bits.
// `static`: each file keeps its own copy, so the linker can never hand code
// built for AVX-512 to a CPU without it.
#pragma once

#include <cstddef>
#include <cstdint>

#include "common/rng.h"

namespace moed::kernels::detail {

static inline void add_normalish_body(std::uint64_t key, float factor, float* x, std::size_t n) {
  const CounterRng noise(key);
  for (std::size_t i = 0; i < n; ++i) x[i] += factor * noise.normalish(i);
}

static inline void add_scaled_body(float factor, const float* d, float* x, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) x[i] += factor * d[i];
}

void add_normalish_avx2(std::uint64_t key, float factor, float* x, std::size_t n);
void add_normalish_avx512(std::uint64_t key, float factor, float* x, std::size_t n);
void add_scaled_avx2(float factor, const float* d, float* x, std::size_t n);
void add_scaled_avx512(float factor, const float* d, float* x, std::size_t n);

}  // namespace moed::kernels::detail
