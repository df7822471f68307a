#include "kernels/cpu/expert_ffn.h"

#include <cstdint>
#include <cstring>

#include "kernels/cpu/gemm.h"

namespace moed::kernels {

float fast_exp(float x) {
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

void silu_mul(const float* gate, const float* up, std::size_t n, float* out) {
  for (std::size_t i = 0; i < n; ++i) {
    float g = gate[i];
    out[i] = g / (1.0f + fast_exp(-g)) * up[i];  // very negative g: g / inf = -0
  }
}

void expert_ffn(const ExpertView& e, const float* x, std::size_t m, float* y, float* scratch) {
  const std::size_t F = e.ffn, H = e.hidden;
  float* h13 = scratch;  // [m, 2F]: W1 x in columns [0, F), W3 x in [F, 2F)
  if (e.w13_packed)
    gemm_fixed_order(x, m, *e.w13_packed, h13);
  else
    gemm_xwt(x, m, H, e.w13, 2 * F, h13);
  // Gate in place: the first F columns of each row become silu(W1 x) * (W3 x).
  for (std::size_t r = 0; r < m; ++r) silu_mul(h13 + r * 2 * F, h13 + r * 2 * F + F, F, h13 + r * 2 * F);
  // y = act · W2ᵀ reading act with a row stride of 2F.
  if (e.w2_packed)
    gemm_fixed_order(h13, m, *e.w2_packed, y, /*lda=*/2 * F);
  else
    gemm_xwt(h13, m, F, e.w2, H, y, /*lda=*/2 * F);
}

}  // namespace moed::kernels
