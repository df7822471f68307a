// The gated activation's loop, out[i] = silu(gate[i]) * up[i] with a
// fixed-sequence exp (activation_body.h), written once and compiled into each instruction set's
// file (expert_ffn.cc portable, silu_avx2.cc, silu_avx512.cc). Every step is
// one IEEE operation per element (no contraction: those files build with
// -ffp-contract=off), so the vector widths give the same bits as the scalar
// loop. `static`: each file keeps its own copy, so the linker can never hand
// code built for AVX-512 to a CPU without it.
#pragma once

#include <cstddef>

#include "kernels/cpu/activation_body.h"

namespace moed::kernels::detail {

static inline void silu_mul_body(const float* gate, const float* up, std::size_t n, float* out) {
  for (std::size_t i = 0; i < n; ++i) {
    out[i] = silu_mul_element(gate[i], up[i]);
  }
}

// The same loop built for AVX2 and for AVX-512F (call only where the CPU has them).
void silu_mul_avx2(const float* gate, const float* up, std::size_t n, float* out);
void silu_mul_avx512(const float* gate, const float* up, std::size_t n, float* out);

}  // namespace moed::kernels::detail
