// What the safetensors reader and writer share (runtime/weights/safetensors_format.h):
// bf16 conversion (round to nearest even, NaN and inf kept), dtype names and sizes,
// element counts that refuse to overflow, shapes as text.
#include "runtime/weights/safetensors_format.h"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

namespace moed::weights {
namespace {

// ---- bf16 ---------------------------------------------------------------------------------

std::uint32_t bits_of(float f) { return std::bit_cast<std::uint32_t>(f); }
float from_bits(std::uint32_t b) { return std::bit_cast<float>(b); }

TEST(Bf16, ExactForRepresentableValues) {
  for (float v : {0.0f, -0.0f, 1.0f, -1.0f, 2.5f, -3.0f, 0.15625f, 65536.0f, 1.0e-38f * 0.0f,
                  from_bits(0x3F810000u), from_bits(0x00010000u) /* subnormal */,
                  from_bits(0x7F7F0000u) /* largest finite bf16 */}) {
    std::uint16_t b = f32_to_bf16(v);
    EXPECT_EQ(b, bits_of(v) >> 16) << v;
    EXPECT_EQ(bits_of(bf16_to_f32(b)), bits_of(v)) << v;
  }
  EXPECT_EQ(f32_to_bf16(1.0f), 0x3F80);
  EXPECT_EQ(f32_to_bf16(-0.0f), 0x8000);
  EXPECT_EQ(bf16_to_f32(0x4049), 3.140625f);
}

TEST(Bf16, RoundsToNearestEven) {
  // Exactly halfway: ties go to the even neighbour.
  EXPECT_EQ(f32_to_bf16(from_bits(0x3F808000u)), 0x3F80);  // lsb 0 stays
  EXPECT_EQ(f32_to_bf16(from_bits(0x3F818000u)), 0x3F82);  // lsb 1 rounds up
  EXPECT_EQ(f32_to_bf16(from_bits(0xBF818000u)), 0xBF82);  // same for negatives
  // Not a tie: nearest.
  EXPECT_EQ(f32_to_bf16(from_bits(0x3F808001u)), 0x3F81);
  EXPECT_EQ(f32_to_bf16(from_bits(0x3F807FFFu)), 0x3F80);
  EXPECT_EQ(f32_to_bf16(from_bits(0x3F80FFFFu)), 0x3F81);
  // Carry into the exponent: just below 2.0 rounds to 2.0.
  EXPECT_EQ(f32_to_bf16(from_bits(0x3FFFFFFFu)), 0x4000);
  // The largest float is past the last bf16 halfway point: it rounds to inf.
  EXPECT_EQ(f32_to_bf16(std::numeric_limits<float>::max()), 0x7F80);
}

TEST(Bf16, InfAndNaN) {
  EXPECT_EQ(f32_to_bf16(std::numeric_limits<float>::infinity()), 0x7F80);
  EXPECT_EQ(f32_to_bf16(-std::numeric_limits<float>::infinity()), 0xFF80);
  EXPECT_TRUE(std::isinf(bf16_to_f32(0x7F80)));
  EXPECT_LT(bf16_to_f32(0xFF80), 0.0f);

  EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(std::numeric_limits<float>::quiet_NaN()))));
  // A NaN whose payload sits only in the dropped low bits must not round to inf.
  std::uint16_t snan = f32_to_bf16(from_bits(0x7F800001u));
  EXPECT_TRUE(std::isnan(bf16_to_f32(snan)));
  EXPECT_TRUE(snan & 0x0040) << "quiet bit set";
  std::uint16_t neg_nan = f32_to_bf16(from_bits(0xFFFFFFFFu));
  EXPECT_TRUE(std::isnan(bf16_to_f32(neg_nan)));
  EXPECT_TRUE(neg_nan & 0x8000) << "sign kept";
}

TEST(Bf16, DtypeNames) {
  EXPECT_STREQ(dtype_name(DType::F32), "F32");
  EXPECT_STREQ(dtype_name(DType::BF16), "BF16");
  EXPECT_EQ(parse_dtype("F32"), DType::F32);
  EXPECT_EQ(parse_dtype("f32"), DType::F32);
  EXPECT_EQ(parse_dtype("BF16"), DType::BF16);
  EXPECT_EQ(parse_dtype("bf16"), DType::BF16);
  EXPECT_EQ(parse_dtype("F16"), std::nullopt);
  EXPECT_EQ(parse_dtype("Bf16"), std::nullopt);
  EXPECT_EQ(parse_dtype(""), std::nullopt);
}

TEST(SafetensorsFormat, ElementSizes) {
  EXPECT_EQ(element_size(DType::F32), 4u);
  EXPECT_EQ(element_size(DType::BF16), 2u);
}

TEST(SafetensorsFormat, StoredDtypeSizes) {
  EXPECT_EQ(stored_dtype_size("F32"), 4u);
  EXPECT_EQ(stored_dtype_size("BF16"), 2u);
  EXPECT_EQ(stored_dtype_size("F8_E4M3"), 1u);  // DeepSeek-V3/R1's fp8 experts
  EXPECT_EQ(stored_dtype_size("U8"), 1u);       // gpt-oss's MXFP4 blocks and scales
  EXPECT_EQ(stored_dtype_size("I8"), 1u);
  EXPECT_EQ(stored_dtype_size("I64"), 8u);
  // Only as safetensors spells them: the lower-case spellings are parse_dtype's alone.
  EXPECT_EQ(stored_dtype_size("f32"), std::nullopt);
  EXPECT_EQ(stored_dtype_size("Q4_K"), std::nullopt);
  EXPECT_EQ(stored_dtype_size(""), std::nullopt);
}

TEST(SafetensorsFormat, CheckedNumel) {
  EXPECT_EQ(checked_numel({}), 1u);  // a scalar
  EXPECT_EQ(checked_numel({2, 3, 4}), 24u);
  EXPECT_EQ(checked_numel({0, 1000}), 0u);
  EXPECT_EQ(checked_numel({std::int64_t(1) << 32, std::int64_t(1) << 31}), std::uint64_t(1) << 63);
  EXPECT_EQ(checked_numel({std::int64_t(1) << 32, std::int64_t(1) << 32}), std::nullopt);
}

TEST(SafetensorsFormat, ShapeText) {
  EXPECT_EQ(shape_str({}), "[]");
  EXPECT_EQ(shape_str({7}), "[7]");
  EXPECT_EQ(shape_str({2, 3}), "[2, 3]");
}

}  // namespace
}  // namespace moed::weights
