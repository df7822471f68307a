// The activations' element functions, one IEEE operation per step, shared
// by the CPU loops (silu_body.h, expert_ffn.cc) and the CUDA kernels
// (kernels/cuda/activation.cu), so that both compute the same bits from the
// same inputs. Neither may contract a multiply and an add into an fma: the
// CPU files build with -ffp-contract=off, the CUDA file with --fmad=false.
// `static` for the reason silu_body.h gives (each instruction set's file
// keeps its own copy).
#pragma once

#include <cstdint>
#include <cstring>

#include "kernels/cpu/elementwise.h"

namespace moed::kernels::detail {

// exp(x): Cody-Waite range reduction and a degree-7 polynomial, relative
// error < 2e-7 where exp is a normal float (inf above, 0 below).
MOED_ELEMENTWISE float fast_exp_body(float x) {
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

// silu(g) * u: very negative g gives g / inf = -0.
MOED_ELEMENTWISE float silu_mul_element(float g, float u) { return g / (1.0f + fast_exp_body(-g)) * u; }

// gpt-oss's: g = min(gate, limit), u = clamp(up, -limit, limit), g σ(alpha g)
// (u + 1). NaN stays NaN through the clamps (std::min/max would drop it), so
// a bad weight still shows.
MOED_ELEMENTWISE float clamped_swiglu_element(float gate, float up, float alpha, float limit) {
  const float g = gate > limit ? limit : gate;
  const float u = up > limit ? limit : (up < -limit ? -limit : up);
  return g / (1.0f + fast_exp_body(-(alpha * g))) * (u + 1.0f);
}

}  // namespace moed::kernels::detail
