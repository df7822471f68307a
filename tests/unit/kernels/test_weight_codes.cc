// The weight formats one value at a time (weight_codes.h) and as matrices
// (encoded_matrix.h): every code's value, rounding to nearest even,
// saturation, the scales' recipes, and cutting a matrix into shards.
#include "kernels/cpu/encoded_matrix.h"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <limits>
#include <vector>

#include "tests/unit/test_support.h"

namespace moed::kernels {
namespace {

TEST(WeightCodes, Fp8ValuesFollowE4m3) {
  EXPECT_EQ(fp8_value(0x00), 0.0f);
  EXPECT_EQ(fp8_value(0x01), std::ldexp(1.0f, -9));   // smallest subnormal
  EXPECT_EQ(fp8_value(0x07), 7 * std::ldexp(1.0f, -9));
  EXPECT_EQ(fp8_value(0x08), std::ldexp(1.0f, -6));   // smallest normal
  EXPECT_EQ(fp8_value(0x38), 1.0f);
  EXPECT_EQ(fp8_value(0x7e), 448.0f);
  EXPECT_EQ(fp8_value(0xb8), -1.0f);
  EXPECT_TRUE(std::isnan(fp8_value(0x7f)));
  EXPECT_TRUE(std::isnan(fp8_value(0xff)));
  // Every non-NaN code round-trips.
  for (int c = 0; c < 256; ++c)
    if (!fp8_is_nan(std::uint8_t(c)) && c != 0x80) {
      EXPECT_EQ(fp8_code(fp8_value(std::uint8_t(c))), c) << c;
    }
}

TEST(WeightCodes, Fp8RoundsToNearestEvenAndSaturates) {
  EXPECT_EQ(fp8_code(1.0625f), 0x38);  // halfway between 1 and 1.125: to the even code (1)
  EXPECT_EQ(fp8_code(1.1875f), 0x3a);  // halfway between 1.125 and 1.25: to 1.25
  EXPECT_EQ(fp8_code(1.07f), 0x39);
  EXPECT_EQ(fp8_code(1000.0f), 0x7e);
  EXPECT_EQ(fp8_code(-1e30f), 0xfe);
  EXPECT_EQ(fp8_code(std::numeric_limits<float>::infinity()), 0x7e);
  EXPECT_EQ(fp8_code(std::ldexp(1.0f, -11)), 0x00);  // below half the smallest subnormal
}

TEST(WeightCodes, Fp4ValuesAndRounding) {
  const float want[8] = {0, 0.5f, 1, 1.5f, 2, 3, 4, 6};
  for (int c = 0; c < 8; ++c) {
    EXPECT_EQ(fp4_value(std::uint8_t(c)), want[c]);
    EXPECT_EQ(fp4_value(std::uint8_t(c | 8)), -want[c]);
    EXPECT_EQ(fp4_code(want[c]), c);
  }
  EXPECT_EQ(fp4_code(2.5f), 4);   // between 2 (code 4) and 3 (code 5): even
  EXPECT_EQ(fp4_code(5.0f), 6);   // between 4 (6) and 6 (7): even
  EXPECT_EQ(fp4_code(0.25f), 0);  // between 0 and 0.5: even
  EXPECT_EQ(fp4_code(100.0f), 7);
  EXPECT_EQ(fp4_code(-100.0f), 15);
}

TEST(WeightCodes, E8m0AndTheMxScale) {
  EXPECT_EQ(e8m0_value(127), 1.0f);
  EXPECT_EQ(e8m0_value(0), std::ldexp(1.0f, -127));
  EXPECT_EQ(e8m0_value(254), std::ldexp(1.0f, 127));
  EXPECT_TRUE(std::isnan(e8m0_value(255)));
  EXPECT_EQ(mx_scale_code(6.0f), 127);   // floor(log2 6) - 2 = 0
  EXPECT_EQ(mx_scale_code(4.0f), 127);
  EXPECT_EQ(mx_scale_code(3.99f), 126);
  EXPECT_EQ(mx_scale_code(0.0f), 127);
}

// The GEMMs' bulk expansion gives e8m0_value's bits times the factor for
// every code, 0 (a subnormal, halved too) and 255 (NaN) included.
TEST(WeightCodes, E8m0ValuesIsE8m0ValueForEveryCode) {
  std::uint8_t codes[256];
  for (int e = 0; e < 256; ++e) codes[e] = std::uint8_t(e);
  for (float factor : {1.0f, 0.5f}) {
    float got[256];
    e8m0_values(codes, 256, factor, got);
    for (int e = 0; e < 256; ++e) {
      const float want = e8m0_value(std::uint8_t(e)) * factor;
      EXPECT_EQ(std::bit_cast<std::uint32_t>(got[e]), std::bit_cast<std::uint32_t>(want)) << "code " << e << " x " << factor;
    }
  }
}

TEST(WeightCodes, Bf16RoundsToNearestEven) {
  EXPECT_EQ(bf16_code(1.0f), 0x3f80);
  EXPECT_EQ(bf16_value(0x3f80), 1.0f);
  EXPECT_EQ(bf16_code(std::bit_cast<float>(0x3f808000u)), 0x3f80);  // tie: to even
  EXPECT_EQ(bf16_code(std::bit_cast<float>(0x3f818000u)), 0x3f82);
  EXPECT_TRUE(std::isnan(bf16_value(bf16_code(std::numeric_limits<float>::quiet_NaN()))));
}

class Encoded : public ::testing::TestWithParam<WeightDtype> {};

// Each weight's value is within the format's step of the original, and the
// scales follow the documented recipes.
TEST_P(Encoded, ValuesApproximateTheWeights) {
  const WeightDtype dtype = GetParam();
  const std::size_t n = 200, k = 320;
  std::vector<float> w = test::random_floats(n * k, 7);
  w[5] = 30.0f;  // one outlier: its tile, block or row scales up
  const EncodedMatrix m = encode(dtype, w.data(), n, k);
  EXPECT_EQ(m.codes.size(), EncodedMatrix::code_bytes(dtype, n, k));
  EXPECT_EQ(m.scales.size(), EncodedMatrix::scale_bytes(dtype, n, k));
  EXPECT_EQ(m.find_nan(), "");
  const std::vector<float> v = m.values();
  for (std::size_t i = 0; i < n; ++i)
    for (std::size_t j = 0; j < k; ++j) {
      const float x = w[i * k + j], s = m.scale(i, j);
      // Half a step of the code grid at x's magnitude, in units of the scale.
      float bound = 0;
      switch (dtype) {
        case WeightDtype::f32:
          bound = 0;
          break;
        case WeightDtype::bf16:
          bound = std::fabs(x) * 0x1p-8f;
          break;
        case WeightDtype::fp8:
          bound = std::max(std::fabs(x) * 0x1p-4f, s * 0x1p-10f);
          break;
        case WeightDtype::int8:
          bound = s * 0.5f;
          break;
        case WeightDtype::mxfp4:
          bound = std::max(std::fabs(x) * 0.25f, s * 0.25f);
          break;
      }
      ASSERT_LE(std::fabs(v[i * k + j] - x), bound * 1.0001f) << to_string(dtype) << " " << i << "," << j;
    }
  if (dtype == WeightDtype::int8) {
    EXPECT_EQ(m.scale(0, 0), 30.0f / 127.0f);
  }
  if (dtype == WeightDtype::fp8) {
    EXPECT_EQ(m.scale(0, 0), 30.0f / 448.0f);
  }
}

// Rows and columns on the grain, stacked back, give the same values; the
// bytes round-trip.
TEST_P(Encoded, ShardsAndStacksKeepEveryValue) {
  const WeightDtype dtype = GetParam();
  const std::size_t n = 256, k = 384;
  const std::vector<float> w = test::random_floats(n * k, 11);
  const EncodedMatrix m = encode(dtype, w.data(), n, k);
  const std::vector<float> v = m.values();
  const EncodedMatrix top = rows_of(m, 0, 128), bottom = rows_of(m, 128, 256);
  EXPECT_EQ(stack(top, bottom).values(), v);
  const EncodedMatrix right = columns_of(m, 128, 384);
  const std::vector<float> rv = right.values();
  for (std::size_t i = 0; i < n; ++i)
    for (std::size_t j = 0; j < 256; ++j) ASSERT_EQ(rv[i * 256 + j], v[i * k + 128 + j]);
  std::vector<std::uint8_t> bytes(m.bytes());
  m.to_bytes(bytes.data());
  EXPECT_EQ(EncodedMatrix::from_bytes(dtype, n, k, bytes.data()).values(), v);
}

TEST(Encoded, CutsOffTheGrainAreRefused) {
  const std::vector<float> w = test::random_floats(256 * 256, 3);
  const EncodedMatrix fp8 = encode(WeightDtype::fp8, w.data(), 256, 256);
  EXPECT_THROW(rows_of(fp8, 0, 64), Error);
  EXPECT_THROW(columns_of(fp8, 64, 256), Error);
  const EncodedMatrix mx = encode(WeightDtype::mxfp4, w.data(), 256, 256);
  EXPECT_THROW(columns_of(mx, 16, 256), Error);
  EXPECT_NO_THROW(rows_of(mx, 16, 48));
}

TEST(Encoded, NaNCodesAndScalesAreFound) {
  const std::vector<float> w = test::random_floats(16 * 64, 5);
  EncodedMatrix fp8 = encode(WeightDtype::fp8, w.data(), 16, 64);
  fp8.codes[70] = 0xff;
  EXPECT_EQ(fp8.find_nan(), "row 1 column 6: an fp8 NaN code");
  EncodedMatrix mx = encode(WeightDtype::mxfp4, w.data(), 16, 64);
  mx.scales[3] = 255;
  EXPECT_EQ(mx.find_nan(), "row 1 block 1: the e8m0 NaN scale (255)");
}

INSTANTIATE_TEST_SUITE_P(Dtypes, Encoded,
                         ::testing::Values(WeightDtype::f32, WeightDtype::bf16, WeightDtype::fp8, WeightDtype::mxfp4,
                                           WeightDtype::int8),
                         [](const auto& info) { return std::string(to_string(info.param)); });

}  // namespace
}  // namespace moed::kernels
