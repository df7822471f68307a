// The pair decoders of the AVX-512 BF16 kernels: each format's codes
// turned into bf16 pairs (bf16_dot_tile.h's layout) with byte and word
// permutes, every code value exact in bf16. Shared by the bf16 products'
// tiles (bf16_dot_avx512.cc) and the amx products' decode tiles
// (amx_fused_avx512.cc): include it only from files built with their flags
// (AVX-512 F, BW, VL, VBMI and BF16; kernels/CMakeLists.txt), so that every
// copy of these inline functions is the same code.
#pragma once

#include <immintrin.h>

#include <cstddef>
#include <cstdint>

#include "kernels/cpu/fixed_order_tile.h"
#include "kernels/cpu/quant_tile.h"

namespace moed::kernels::detail::pair_codes {

// bf16 codes of the formats' magnitudes, built once at compile time.
constexpr std::uint16_t bf16_of_fp8_magnitude(int m) {  // e4m3: eeee.mmm, bias 7
  const int e = m >> 3, f = m & 7;
  if (e > 0) return std::uint16_t((e + 120) << 7 | f << 4);
  if (f == 0) return 0;
  int shift = 0;  // f x 2^-9, normalised
  while ((f << shift) < 8) ++shift;
  return std::uint16_t((121 - shift) << 7 | ((f << shift) & 7) << 4);
}
constexpr std::uint16_t bf16_of_integer(int i) {  // 0..127, exact
  if (i == 0) return 0;
  int e = 0;
  while ((i >> (e + 1)) != 0) ++e;
  return std::uint16_t((e + 127) << 7 | ((i << (7 - e)) & 0x7f));
}
inline constexpr std::uint16_t kFp4Bf16[8] = {0, 0x3f00, 0x3f80, 0x3fc0, 0x4000, 0x4040, 0x4080, 0x40c0};

// 128-entry byte tables, high and low bytes of each magnitude's bf16 code,
// as the two 64-byte halves vpermi2b reads.
struct ByteTables {
  __m512i hi0, hi1, lo0, lo1;
};
template <class Code>
ByteTables byte_tables(Code code) {
  alignas(64) unsigned char hi[128], lo[128];
  for (int m = 0; m < 128; ++m) {
    hi[m] = static_cast<unsigned char>(code(m) >> 8);
    lo[m] = static_cast<unsigned char>(code(m) & 0xff);
  }
  return {_mm512_load_si512(hi), _mm512_load_si512(hi + 64), _mm512_load_si512(lo), _mm512_load_si512(lo + 64)};
}

// The byte permutes that lay out two k pairs from 4 steps of 16 one-byte
// codes: output byte 2e + b of pair u (element e = 2 l + s) is the low (b 0)
// or high (b 1) byte of step 2u + s, lane l.
inline __m512i assemble_index(int u) {
  alignas(64) unsigned char idx[64];
  for (int j = 0; j < 64; ++j) {
    const int e = j / 2, b = j % 2, l = e / 2, s = e % 2;
    idx[j] = static_cast<unsigned char>(b << 6 | ((2 * u + s) * 16 + l));
  }
  return _mm512_load_si512(idx);
}

inline __mmask64 first_bytes(std::size_t count) { return count >= 64 ? ~__mmask64(0) : (__mmask64(1) << count) - 1; }

// Each format's decoder turns up to 4 steps of one panel (two k pairs),
// from step s (a multiple of 4) of a stream that starts at `base` (a scale
// block's start), into two vectors of bf16 pairs; missing steps decode to
// 0. Its tables are members, so a kernel holding one keeps them in
// registers.
template <bool Signed>  // int8 (two's complement) or fp8 (sign and magnitude)
struct ByteCodes {
  static constexpr std::size_t kStepBytes = 16;
  ByteTables t = Signed ? byte_tables(bf16_of_integer) : byte_tables(bf16_of_fp8_magnitude);
  __m512i pair0 = assemble_index(0), pair1 = assemble_index(1), sign = _mm512_set1_epi8(char(0x80));
  void two(const std::uint8_t* base, std::size_t s, std::size_t steps, __m512i& out0, __m512i& out1) const {
    const std::uint8_t* src = base + s * kStepBytes;
    const __m512i c =
        steps >= 4 ? _mm512_loadu_si512(src) : _mm512_maskz_loadu_epi8(first_bytes(kStepBytes * steps), src);
    const __m512i mag = Signed ? _mm512_abs_epi8(c) : c;  // bit 7 is not read by vpermi2b
    __m512i hi = _mm512_permutex2var_epi8(t.hi0, mag, t.hi1);
    const __m512i lo = _mm512_permutex2var_epi8(t.lo0, mag, t.lo1);
    hi = _mm512_ternarylogic_epi32(hi, c, sign, 0xf8);  // hi | (c & sign)
    out0 = _mm512_permutex2var_epi8(lo, pair0, hi);
    out1 = _mm512_permutex2var_epi8(lo, pair1, hi);
  }
};

struct Bf16Codes {
  static constexpr std::size_t kStepBytes = 32;
  __m512i interleave = [] {
    alignas(64) std::uint16_t idx[32];
    for (int e = 0; e < 32; ++e) idx[e] = static_cast<std::uint16_t>((e % 2) * 16 + e / 2);
    return _mm512_load_si512(idx);
  }();
  void two(const std::uint8_t* base, std::size_t s, std::size_t steps, __m512i& out0, __m512i& out1) const {
    const std::uint8_t* src = base + s * kStepBytes;
    const __m512i c0 = steps >= 4 ? _mm512_loadu_si512(src) : _mm512_maskz_loadu_epi8(first_bytes(32 * steps), src);
    const __m512i c1 = steps >= 4 ? _mm512_loadu_si512(src + 64)
                                  : _mm512_maskz_loadu_epi8(first_bytes(steps > 2 ? 32 * (steps - 2) : 0), src + 64);
    out0 = _mm512_permutexvar_epi16(interleave, c0);
    out1 = _mm512_permutexvar_epi16(interleave, c1);
  }
};

// mxfp4 (quant_tile.h's layout): steps s..s + 3 are nibbles (s % 8) / 2
// and the next of their group's 32 words, so each pair is one word shift
// and one lookup (vpermw reads 5 bits: the table repeats). Missing steps
// decode to 0 (mxfp4's k is whole 32-step blocks: none in practice).
struct Fp4Codes {
  static constexpr std::size_t kStepBytes = 8;  // on average; the codes go by 64-byte groups
  __m512i values;
  Fp4Codes() {
    alignas(64) std::uint16_t v[32];
    for (int e = 0; e < 32; ++e) {
      const int nibble = e % 16;
      v[e] = static_cast<std::uint16_t>(kFp4Bf16[nibble & 7] | (nibble & 8 ? 0x8000 : 0));
    }
    values = _mm512_load_si512(v);
  }
  // A whole group from step s (a multiple of 8): its four pairs, the first
  // without a shift (the lookup reads the low 5 bits; the table repeats).
  void group(const std::uint8_t* base, std::size_t s, __m512i& out0, __m512i& out1, __m512i& out2,
             __m512i& out3) const {
    const __m512i codes = _mm512_loadu_si512(base + s / kFp4GroupSteps * kFp4GroupBytes);
    out0 = _mm512_permutexvar_epi16(codes, values);
    out1 = _mm512_permutexvar_epi16(_mm512_srli_epi16(codes, 4), values);
    out2 = _mm512_permutexvar_epi16(_mm512_srli_epi16(codes, 8), values);
    out3 = _mm512_permutexvar_epi16(_mm512_srli_epi16(codes, 12), values);
  }
  void two(const std::uint8_t* base, std::size_t s, std::size_t steps, __m512i& out0, __m512i& out1) const {
    if (steps == 0) {  // past the range: its group may lie past the codes
      out0 = out1 = _mm512_setzero_si512();
      return;
    }
    const __m512i group = _mm512_loadu_si512(base + s / kFp4GroupSteps * kFp4GroupBytes);
    const int shift = int(4 * (s % 8 / 2));
    out0 = _mm512_permutexvar_epi16(_mm512_srl_epi16(group, _mm_cvtsi32_si128(shift)), values);
    out1 = _mm512_permutexvar_epi16(_mm512_srl_epi16(group, _mm_cvtsi32_si128(shift + 4)), values);
    if (steps < 4) {
      constexpr __mmask32 kFirstStep = 0x55555555u;  // words 2 l: a pair's first step
      if (steps == 1) out0 = _mm512_maskz_mov_epi16(kFirstStep, out0);  // steps 2 and 3: out0 whole
      out1 = steps == 3 ? _mm512_maskz_mov_epi16(kFirstStep, out1) : _mm512_setzero_si512();
    }
  }
};

template <template <int, class> class Tile, class Codes>
struct WithCodes {
  template <int Rows>
  using Of = Tile<Rows, Codes>;
};

// Tile<Rows, Codes>::run(args...) with the decoder of the panels' format
// and the instance of `rows` rows, up to the format's most (run_rows).
template <template <int, class> class Tile, int Bf16Rows, int Fp8Rows, int Int8Rows, int Fp4Rows, class... Args>
void run_decoding(QuantPanel::Kind kind, std::size_t rows, Args... args) {
  switch (kind) {
    case QuantPanel::bf16:
      return run_rows<WithCodes<Tile, Bf16Codes>::template Of, Bf16Rows>(rows, args...);
    case QuantPanel::fp8:
      return run_rows<WithCodes<Tile, ByteCodes<false>>::template Of, Fp8Rows>(rows, args...);
    case QuantPanel::int8:
      return run_rows<WithCodes<Tile, ByteCodes<true>>::template Of, Int8Rows>(rows, args...);
    case QuantPanel::mxfp4:
      return run_rows<WithCodes<Tile, Fp4Codes>::template Of, Fp4Rows>(rows, args...);
  }
}

}  // namespace moed::kernels::detail::pair_codes
