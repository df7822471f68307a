// The number formats experts can be held in, one value at a time: the
// reference every vector decoder is tested against (quant_weights.h).
//
// Each code's value is defined by one exact conversion and at most one fp32
// multiply by its scale (weight_codes.cc says which), so a plain loop, the
// AVX2 loop and the AVX-512 loop all give the same bits.
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>

namespace moed::kernels {

// How a rank holds its experts ([experts].dtype):
//   f32    4 bytes a weight;
//   bf16   2 bytes, the top half of an fp32;
//   fp8    1 byte, e4m3 (OCP "fn": no inf, max 448), times an fp32 scale per
//          128 x 128 tile, as DeepSeek-V3/R1 ship it (weight_scale_inv);
//   mxfp4  4 bits, e2m1, times 2^(e - 127) per 32 weights of a row (an e8m0
//          byte), as gpt-oss ships it (OCP microscaling);
//   int8   1 byte, times an fp32 scale per output channel (row), quantized at
//          load: scale = max |w| / 127, q = round-to-even(w / scale).
enum class WeightDtype { f32, bf16, fp8, mxfp4, int8 };
const char* to_string(WeightDtype dtype);
// "f32", "bf16", "fp8", "mxfp4", "int8"; false when none of those.
bool parse_weight_dtype(const std::string& name, WeightDtype* out);

// bf16: the top 16 bits of an fp32; rounding is to nearest, ties to even
// (NaN stays a quiet NaN, overflow becomes inf).
float bf16_value(std::uint16_t code);
// Inline and branch-free, so that loops over many (the bf16 products'
// activations) vectorise.
inline std::uint16_t bf16_code(float value) {
  const auto bits = std::bit_cast<std::uint32_t>(value);
  // Adding 0x7fff rounds halves down; the extra 1 when the kept lsb is odd
  // makes ties go to even; a carry into the exponent is right (up to inf).
  const std::uint32_t rounded = (bits + 0x7fff + ((bits >> 16) & 1)) >> 16;
  // Rounding could carry a NaN's payload into the exponent and make it inf:
  // a NaN keeps its top half with the quiet bit set instead.
  return std::uint16_t((bits & 0x7fffffff) > 0x7f800000 ? (bits >> 16) | 0x40 : rounded);
}

// fp8 e4m3fn: 1 sign, 4 exponent (bias 7), 3 mantissa bits; S.1111.111 is
// NaN, there is no inf. Encoding rounds to nearest, ties to even, and
// saturates at +-448; NaN encodes as 0x7f.
float fp8_value(std::uint8_t code);
std::uint8_t fp8_code(float value);
inline bool fp8_is_nan(std::uint8_t code) { return (code & 0x7f) == 0x7f; }
constexpr float kFp8Max = 448.0f;
constexpr int kFp8Tile = 128;  // a scale's tile: 128 rows x 128 columns

// fp4 e2m1 (a nibble): 1 sign, 2 exponent (bias 1), 1 mantissa bit: 0, 0.5,
// 1, 1.5, 2, 3, 4, 6. Encoding rounds to nearest, ties to even, saturates.
float fp4_value(std::uint8_t nibble);
std::uint8_t fp4_code(float value);
constexpr float kFp4Max = 6.0f;
constexpr int kMxBlock = 32;  // weights of a row sharing one e8m0 scale
// e8m0: 2^(e - 127); 255 is NaN. 0 gives 2^-127, a subnormal. Inline: the
// GEMMs' scale loops call it per block.
inline float e8m0_value(std::uint8_t e) {
  if (e == 255) return std::numeric_limits<float>::quiet_NaN();
  return e == 0 ? 0x1p-127f : std::bit_cast<float>(std::uint32_t(e) << 23);
}
// out[i] = e8m0_value(e[i]) x factor (a power of two: exact), for the GEMMs
// that expand a range's scales at once: branch-free, 0 and 255 by their bits.
inline void e8m0_values(const std::uint8_t* e, std::size_t count, float factor, float* out) {
  for (std::size_t i = 0; i < count; ++i) {
    const std::uint32_t code = e[i];  // 0: 2^-127 (bit 22 alone); 255: inf's bits, NaN with bit 22
    const std::uint32_t bits = code << 23 | std::uint32_t((code == 0) | (code == 255)) << 22;
    out[i] = std::bit_cast<float>(bits) * factor;
  }
}
// The OCP scale of a block whose largest magnitude is `amax`: 2^(floor(log2
// amax) - 2), so the largest weight lands in [4, 8) before saturation at 6;
// 127 (1.0) for a block of zeros.
std::uint8_t mx_scale_code(float amax);

}  // namespace moed::kernels
