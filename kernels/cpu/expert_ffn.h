// The SwiGLU expert FFN on CPU: y = W2 · (silu(W1 x) ⊙ (W3 x)).
#pragma once

#include <cstddef>

namespace moed::kernels {

// One expert's weights in fp32, torch Linear layout. W1 and W3 are stacked into
// one [2F, H] matrix so the up-projection is a single sgemm.
struct ExpertView {
  const float* w13 = nullptr;  // [2F, H]: rows [0, F) are W1, rows [F, 2F) are W3
  const float* w2 = nullptr;   // [H, F]
  std::size_t hidden = 0;      // H
  std::size_t ffn = 0;         // F
};

// Scratch floats expert_ffn needs for m rows.
inline std::size_t expert_ffn_scratch(const ExpertView& e, std::size_t m) { return m * 2 * e.ffn; }

// y[m, H] for x[m, H]: two sgemm calls (w13, then w2) and the gated activation.
void expert_ffn(const ExpertView& e, const float* x, std::size_t m, float* y, float* scratch);

// out[i] = silu(gate[i]) * up[i], with a fixed-sequence exp (same bits on every run).
void silu_mul(const float* gate, const float* up, std::size_t n, float* out);

// exp(x) for the activation: Cody-Waite range reduction and a degree-7
// polynomial, relative error < 2e-7 where exp is a normal float (inf above,
// 0 below); plain arithmetic the compiler can vectorise.
float fast_exp(float x);

}  // namespace moed::kernels
