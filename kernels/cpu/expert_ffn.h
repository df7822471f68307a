// The SwiGLU expert FFN on CPU: y = W2 · (silu(W1 x) ⊙ (W3 x)).
#pragma once

#include <cstddef>

#include "kernels/cpu/fixed_order_gemm.h"

namespace moed::kernels {

// One expert's weights in fp32. W1 and W3 are stacked into one [2F, H] matrix
// (rows [0, F) are W1, rows [F, 2F) are W3) so the up-projection is a single
// GEMM. Either packed for the fixed-order GEMM (the default: a row's bits do
// not depend on its batch) or in torch Linear layout for OpenBLAS.
struct ExpertView {
  const PackedWeights* w13_packed = nullptr;  // [2F, H]
  const PackedWeights* w2_packed = nullptr;   // [H, F]
  const float* w13 = nullptr;                 // [2F, H], row-major (OpenBLAS)
  const float* w2 = nullptr;                  // [H, F], row-major (OpenBLAS)
  std::size_t hidden = 0;                     // H
  std::size_t ffn = 0;                        // F
};

// Scratch floats expert_ffn needs for m rows.
inline std::size_t expert_ffn_scratch(const ExpertView& e, std::size_t m) { return m * 2 * e.ffn; }

// y[m, H] for x[m, H]: two GEMM calls (w13, then w2) and the gated activation;
// fixed-order GEMMs when the view holds packed weights, else OpenBLAS.
void expert_ffn(const ExpertView& e, const float* x, std::size_t m, float* y, float* scratch);

// out[i] = silu(gate[i]) * up[i], with a fixed-sequence exp (same bits on every run).
void silu_mul(const float* gate, const float* up, std::size_t n, float* out);

// exp(x) for the activation: Cody-Waite range reduction and a degree-7
// polynomial, relative error < 2e-7 where exp is a normal float (inf above,
// 0 below); plain arithmetic the compiler can vectorise.
float fast_exp(float x);

}  // namespace moed::kernels
