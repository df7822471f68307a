// The panel decoders of quant_weights.h, written once and compiled into each
// instruction set's file (quant_weights.cc portable, quant_decode_avx2.cc,
// quant_decode_avx512.cc), like silu_body.h: each weight's value is one
// exact conversion and at most one fp32 multiply (no contraction: those files
// build with -ffp-contract=off), so every width gives the scalar loop's bits,
// which are weight_codes.h's. Each writes out[kk * 16 + r] for kc k steps of
// one panel, 16 lanes a step. `static`: each file keeps its own copy.
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>

#include "kernels/cpu/quant_tile.h"  // mxfp4's layout

namespace moed::kernels::detail {

constexpr std::size_t kLanes = 16;

static inline void decode_bf16_body(const std::uint16_t* codes, std::size_t kc, float* out) {
  for (std::size_t i = 0; i < kc * kLanes; ++i) out[i] = std::bit_cast<float>(std::uint32_t(codes[i]) << 16);
}

// fp8 e4m3 (weight_codes.cc): the magnitude's bits into an fp32's, times
// 2^120 (exact), the sign, then the tile's scale.
static inline void decode_fp8_body(const std::uint8_t* codes, std::size_t kc, float scale, float* out) {
  for (std::size_t i = 0; i < kc * kLanes; ++i) {
    const std::uint32_t c = codes[i];
    const float magnitude = std::bit_cast<float>((c & 0x7f) << 20) * 0x1p120f;
    const float value = std::bit_cast<float>(std::bit_cast<std::uint32_t>(magnitude) | ((c & 0x80) << 24));
    out[i] = value * scale;
  }
}

static inline void decode_int8_body(const std::int8_t* codes, std::size_t kc, const float* scales, float* out) {
  for (std::size_t kk = 0; kk < kc; ++kk)
    for (std::size_t r = 0; r < kLanes; ++r) out[kk * kLanes + r] = float(codes[kk * kLanes + r]) * scales[r];
}

// fp4 e2m1: 3 bits into bits 22-24 of an fp32, times 2^126 (exact), the
// sign, then the lane's e8m0 scale 2^(e - 127) (e = 0: the subnormal 2^-127).
// codes: the panel's (quant_tile.h's layout); steps [first, first + kc).
static inline void decode_mxfp4_body(const std::uint8_t* codes, std::size_t first, std::size_t kc,
                                     const std::uint8_t* exps, float* out) {
  float scale[kLanes];
  for (std::size_t r = 0; r < kLanes; ++r)
    scale[r] = std::bit_cast<float>(exps[r] == 0 ? std::uint32_t(0x00400000) : std::uint32_t(exps[r]) << 23);
  for (std::size_t kk = 0; kk < kc; ++kk)
    for (std::size_t r = 0; r < kLanes; ++r) {
      const std::size_t s = first + kk;
      const std::uint32_t c = std::uint32_t(codes[fp4_code_byte(s, r)] >> fp4_code_shift(s)) & 15;
      const float magnitude = std::bit_cast<float>((c & 7) << 22) * 0x1p126f;
      const float value = std::bit_cast<float>(std::bit_cast<std::uint32_t>(magnitude) | ((c & 8) << 28));
      out[kk * kLanes + r] = value * scale[r];
    }
}

// The four, built for one instruction set.
struct PanelDecoders {
  void (*bf16)(const std::uint16_t*, std::size_t, float*);
  void (*fp8)(const std::uint8_t*, std::size_t, float, float*);
  void (*int8)(const std::int8_t*, std::size_t, const float*, float*);
  void (*mxfp4)(const std::uint8_t*, std::size_t, std::size_t, const std::uint8_t*, float*);
};
PanelDecoders avx2_decoders();    // only where the CPU has AVX2
PanelDecoders avx512_decoders();  // only where the CPU has AVX-512F and BW

// The four loops above as built in the including file.
static inline PanelDecoders decoders_built_here() {
  return {[](const std::uint16_t* c, std::size_t kc, float* out) { decode_bf16_body(c, kc, out); },
          [](const std::uint8_t* c, std::size_t kc, float s, float* out) { decode_fp8_body(c, kc, s, out); },
          [](const std::int8_t* c, std::size_t kc, const float* s, float* out) { decode_int8_body(c, kc, s, out); },
          [](const std::uint8_t* c, std::size_t first, std::size_t kc, const std::uint8_t* e, float* out) {
            decode_mxfp4_body(c, first, kc, e, out);
          }};
}

}  // namespace moed::kernels::detail
