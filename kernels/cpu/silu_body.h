// The gated activation's loop, out[i] = silu(gate[i]) * up[i] with a
// fixed-sequence exp, written once and compiled into each instruction set's
// file (expert_ffn.cc portable, silu_avx2.cc, silu_avx512.cc). Every step is
// one IEEE operation per element (no contraction: those files build with
// -ffp-contract=off), so the vector widths give the same bits as the scalar
// loop. `static`: each file keeps its own copy, so the linker can never hand
// code built for AVX-512 to a CPU without it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

namespace moed::kernels::detail {

// exp(x): Cody-Waite range reduction and a degree-7 polynomial, relative
// error < 2e-7 where exp is a normal float (inf above, 0 below).
static inline float fast_exp_body(float x) {
  // exp overflows above ~88.72 and flushes to 0 below ~-87.34 (no denormals).
  const float clamped = x < -87.0f ? -87.0f : (x > 88.0f ? 88.0f : x);
  // x = n ln2 + r with n = round(x / ln2): adding 1.5 * 2^23 rounds to an
  // integer in plain arithmetic (no floorf call, so the loop vectorises).
  const float shifter = 12582912.0f;
  float n = (clamped * 1.44269504f + shifter) - shifter;
  // ln2 in two parts, so n * ln2_hi is exact for the n that occur.
  float r = clamped - n * 0.693359375f;
  r = r - n * -2.12194440e-4f;
  // exp(r) on [-ln2/2, ln2/2]: degree-7 Taylor polynomial, Horner form.
  float p = 1.0f / 5040.0f;
  p = p * r + 1.0f / 720.0f;
  p = p * r + 1.0f / 120.0f;
  p = p * r + 1.0f / 24.0f;
  p = p * r + 1.0f / 6.0f;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  // Scale by 2^n through the exponent bits.
  std::int32_t bits = (static_cast<std::int32_t>(n) + 127) << 23;
  float scale;
  std::memcpy(&scale, &bits, sizeof scale);
  float result = p * scale;
  return x > 88.72f ? __builtin_inff() : (x < -87.34f ? 0.0f : result);
}

static inline void silu_mul_body(const float* gate, const float* up, std::size_t n, float* out) {
  for (std::size_t i = 0; i < n; ++i) {
    float g = gate[i];
    out[i] = g / (1.0f + fast_exp_body(-g)) * up[i];  // very negative g: g / inf = -0
  }
}

// The same loop built for AVX2 and for AVX-512F (call only where the CPU has them).
void silu_mul_avx2(const float* gate, const float* up, std::size_t n, float* out);
void silu_mul_avx512(const float* gate, const float* up, std::size_t n, float* out);

}  // namespace moed::kernels::detail
