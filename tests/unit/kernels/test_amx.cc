// The GEMM in AMX's arithmetic (amx_gemm.h): the tiles equal the portable
// loops bit for bit where the CPU has AMX, and both equal a plain loop
// written here from the definition (activations rounded to bf16, 32-step
// blocks of an even and an odd chain, fp8's scales on the scale blocks'
// sums, mxfp4's in the weights),
// also where products underflow (the tiles flush them); a row's bits do not
// depend on its batch; a k range is the matrix of those columns; the error
// against fp32 on the same values stays within bf16's rounding.
#include "kernels/cpu/amx_gemm.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <utility>
#include <vector>

#include "kernels/cpu/amx_tile.h"
#include "kernels/cpu/bf16_dot_gemm.h"
#include "tests/unit/kernels/dot_gemm_checks.h"
#include "tests/unit/kernels/isas_here.h"
#include "tests/unit/test_support.h"

namespace moed::kernels {
namespace {

using test::code_value;
using test::flushed;
using test::isas_here;

struct Case {
  WeightDtype dtype;
  std::size_t m, n, k;
};

// The definition, one output at a time: columns [k0, k1) of x (the whole
// row) against W's row j.
float definition(const EncodedMatrix& e, const float* x, std::size_t j, std::size_t k0, std::size_t k1) {
  const std::size_t scale_block = e.dtype == WeightDtype::fp8 ? 128 : 0;
  auto xb = [&](std::size_t kk) { return kk < k1 ? flushed(bf16_value(bf16_code(x[kk]))) : 0.0f; };
  auto wv = [&](std::size_t kk) {  // mxfp4: the value with its power-of-two scale, flushed
    if (kk >= k1) return 0.0f;
    return flushed(e.dtype == WeightDtype::mxfp4 ? code_value(e, j, kk) * e.scale(j, kk) : code_value(e, j, kk));
  };
  auto tile_product = [&](std::size_t from) {  // 32 steps: T = E + O
    float even = 0.0f, odd = 0.0f;
    for (std::size_t kk = from; kk < from + 32; kk += 2) {
      even = flushed(std::fma(xb(kk), wv(kk), even));
      odd = flushed(std::fma(xb(kk + 1), wv(kk + 1), odd));
    }
    return flushed(even + odd);
  };
  auto sum = [&](std::size_t from, std::size_t to) {
    float s = 0.0f;
    for (std::size_t b = from; b < to; b += 32) s = flushed(s + tile_product(b));
    return s;
  };
  if (scale_block == 0) {
    const float s = sum(k0, k1);
    return e.dtype == WeightDtype::int8 ? s * e.scale(j, 0) : s;
  }
  float total = 0.0f;
  for (std::size_t b = k0; b < k1; b += scale_block)
    total = std::fma(sum(b, std::min(k1, b + scale_block)), e.scale(j, b), total);
  return total;
}

class Amx : public ::testing::TestWithParam<Case> {
 protected:
  void SetUp() override { set_compact_products(CompactProducts::amx); }
  void TearDown() override {
    set_compact_products(CompactProducts::f32);
    set_gemm_isa(best_gemm_isa());
  }
};

std::vector<float> expected(const EncodedMatrix& e, const std::vector<float>& a, std::size_t m) {
  std::vector<float> want(m * e.n);
  for (std::size_t i = 0; i < m; ++i)
    for (std::size_t j = 0; j < e.n; ++j) want[i * e.n + j] = definition(e, a.data() + i * e.k, j, 0, e.k);
  return want;
}

TEST_P(Amx, EveryKernelIsTheDefinition) {
  const Case c = GetParam();
  test::expect_every_kernel_is(definition, c.dtype, c.m, c.n, c.k);
}

TEST_P(Amx, RowBitsDoNotDependOnTheBatch) {
  const Case c = GetParam();
  const InvarianceProbe probe = probe_row_invariance(c.dtype, c.n, c.k);  // the products set above
  EXPECT_TRUE(probe.invariant) << probe.detail;
}

TEST_P(Amx, ErrorIsBf16Rounding) {
  const Case c = GetParam();
  test::expect_error_within_bf16_rounding(c.dtype, c.m, c.n, c.k);
}

std::vector<Case> cases() {
  std::vector<Case> out;
  for (WeightDtype d : {WeightDtype::bf16, WeightDtype::fp8, WeightDtype::mxfp4, WeightDtype::int8}) {
    const std::size_t odd_k = d == WeightDtype::mxfp4 ? 320 : 301;  // mxfp4 needs k % 32 == 0
    out.push_back({d, 1, 48, 64});
    // One and two row tiles, a partial one; two panels, one, a partial one.
    for (std::size_t m : {5, 16, 20, 33}) out.push_back({d, m, 40, odd_k});
    out.push_back({d, 70, 32, 544});  // three k chunks of 256
    // The decode tiles (up to 8 rows): four panels side by side at 1 and 2
    // rows, two at 3 and 4, one beyond; a group's leftover panels and a
    // partial one through the tiles.
    out.push_back({d, 1, 128, 64});
    out.push_back({d, 2, 72, odd_k});
    for (std::size_t m : {3, 4, 8}) out.push_back({d, m, 120, odd_k});
    // Whole blocks (fp8: whole scale blocks, and a partial one), which an
    // AMX CPU runs on the tiles at those rows.
    for (std::size_t m : {1, 2, 3, 4}) out.push_back({d, m, 72, 416});
  }
  return out;
}

INSTANTIATE_TEST_SUITE_P(Dtypes, Amx, ::testing::ValuesIn(cases()), [](const auto& info) {
  const Case& c = info.param;
  return fmt::format("{}_{}x{}x{}", to_string(c.dtype), c.m, c.n, c.k);
});

// Products and sums below fp32's normal range are flushed to 0 by the tiles
// (measured on Sapphire Rapids' successors); the definition flushes them
// too. Activations near 2^-70 against weights near 2^-60 put most products
// there and the rest just above.
TEST(Amx, UnderflowIsFlushedAsTheTilesDo) {
  set_compact_products(CompactProducts::amx);
  const std::size_t m = 20, n = 32, k = 96;
  std::vector<float> w = test::random_floats(n * k, 7), a = test::random_floats(m * k, 8);
  for (float& v : w) v = std::ldexp(v, -60);
  for (std::size_t i = 0; i < a.size(); ++i) a[i] = std::ldexp(a[i], i % 3 == 0 ? -70 : -64);
  const EncodedMatrix encoded = encode(WeightDtype::bf16, w.data(), n, k);
  const std::vector<float> want = expected(encoded, a, m);
  std::size_t zeros = 0;
  for (float v : want) zeros += v == 0.0f;
  EXPECT_GT(zeros, 0u) << "no output was flushed: the case does not reach the subnormal range";
  for (GemmIsa isa : isas_here()) {
    set_gemm_isa(isa);
    std::vector<float> got(m * n);
    gemm_fixed_order(a.data(), m, QuantWeights(encoded), got.data());
    EXPECT_EQ(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)), 0) << to_string(isa);
  }
  set_compact_products(CompactProducts::f32);
  set_gemm_isa(best_gemm_isa());
}

// The same at the decode tiles' sizes (1 to 8 rows, four panels; and 20), with
// mxfp4 too: its weights near 2^-125 have scales at the bottom of e8m0's
// range (2^-127 itself, a subnormal float, among them), so that many scaled
// weights fall below fp32's normal range and are read as 0, as the tiles do.
TEST(Amx, DecodeTilesFlushAsTheTilesDo) {
  set_compact_products(CompactProducts::amx);
  const std::size_t n = 64;
  // k = 32: one tile product, whose T of -0 (two chains flushed from below
  // 0) the sum from +0 makes +0.
  for (std::size_t k : {32, 96})
    for (WeightDtype dtype : {WeightDtype::bf16, WeightDtype::mxfp4}) {
      const bool fp4 = dtype == WeightDtype::mxfp4;
      std::vector<float> w = test::random_floats(n * k, 11);
      for (std::size_t i = 0; i < w.size(); ++i) w[i] = std::ldexp(w[i], fp4 ? -122 - int(i / 32 % 4) : -60);
      const EncodedMatrix encoded = encode(dtype, w.data(), n, k);
      if (fp4) {
        std::size_t below_normal = 0;
        for (std::size_t j = 0; j < n; ++j)
          for (std::size_t kk = 0; kk < k; ++kk)
            below_normal += std::fpclassify(code_value(encoded, j, kk) * encoded.scale(j, kk)) == FP_SUBNORMAL;
        EXPECT_GT(below_normal, 0u) << "no scaled weight below fp32's normal range: the case does not test the flush";
      }
      for (std::size_t m : {1, 2, 3, 4, 8, 20}) {
        std::vector<float> a = test::random_floats(m * k, 12);
        for (std::size_t i = 0; i < a.size(); ++i) a[i] = std::ldexp(a[i], fp4 ? 40 : i % 3 == 0 ? -70 : -64);
        const std::vector<float> want = expected(encoded, a, m);
        std::size_t zeros = 0;
        for (float v : want) zeros += v == 0.0f;
        if (!fp4) {
          EXPECT_GT(zeros, 0u) << "no output was flushed at " << m << " rows";
        }
        for (GemmIsa isa : isas_here()) {
          set_gemm_isa(isa);
          std::vector<float> got(m * n);
          gemm_fixed_order(a.data(), m, QuantWeights(encoded), got.data());
          EXPECT_EQ(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)), 0)
              << to_string(dtype) << " " << m << " rows " << to_string(isa);
        }
      }
    }
  set_compact_products(CompactProducts::f32);
  set_gemm_isa(best_gemm_isa());
}

// Subnormal inputs are read as 0 (DAZ) by the tiles and the decode tiles
// alike: rows of activations near 2^60 against columns of subnormal bf16
// weights, and rows of subnormal activations against weights near 2^60,
// whose products would be normal (near 2^-70); at the decode tiles' sizes
// and the tiles' (20 rows).
TEST(Amx, SubnormalInputsAreReadAsZero) {
  set_compact_products(CompactProducts::amx);
  const std::size_t n = 64, k = 96;
  const auto scaled = [](std::vector<float> v, std::size_t row_length, auto exponent) {
    for (std::size_t i = 0; i < v.size(); ++i) v[i] = std::ldexp(v[i], exponent(i / row_length));
    return v;
  };
  const auto magnitude = [](std::size_t row) { return row % 3 == 0 ? -130 : row % 3 == 1 ? 60 : 0; };
  const std::vector<float> w = scaled(test::random_floats(n * k, 13), k, magnitude);
  const EncodedMatrix encoded = encode(WeightDtype::bf16, w.data(), n, k);
  for (std::size_t m : {1, 3, 20}) {
    const std::vector<float> a = scaled(test::random_floats(m * k, 14), k, [](std::size_t row) {
      return row % 3 == 0 ? 60 : row % 3 == 1 ? -130 : 0;
    });
    const std::vector<float> want = expected(encoded, a, m);
    for (GemmIsa isa : isas_here()) {
      set_gemm_isa(isa);
      std::vector<float> got(m * n);
      gemm_fixed_order(a.data(), m, QuantWeights(encoded), got.data());
      EXPECT_EQ(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)), 0) << m << " rows " << to_string(isa);
    }
  }
  set_compact_products(CompactProducts::f32);
  set_gemm_isa(best_gemm_isa());
}

// mxfp4 with every scale in [2, 252], the extremes among them: on an AMX
// CPU, 1 to 8 rows run on the tiles with the pairs scaled in registers (a
// saturating subtract from codes 2^125 too large). Rows near 2^-20 keep
// the sums under the scale 2^125 finite; under 2^-125 many products fall
// below fp32's normal range, which the tiles flush, and so must this path.
TEST(Amx, Mxfp4ScalesAtTheEdgesOfTheTilesRangeApply) {
  set_compact_products(CompactProducts::amx);
  const std::size_t n = 64, k = 320;
  EncodedMatrix e = encode(WeightDtype::mxfp4, test::random_floats(n * k, 21).data(), n, k);
  constexpr std::uint8_t kScales[] = {2, 3, 100, 126, 127, 128, 200, 251, 252};
  for (std::size_t b = 0; b < e.scales.size(); ++b) e.scales[b] = kScales[b * 7 % std::size(kScales)];
  test::expect_definition_at_rows(definition, e, {1, 2, 3, 4, 8}, -20);
  set_compact_products(CompactProducts::f32);
}

// The mxfp4 scales a decode tile may apply to its chains' sums (amx_tile.h):
// the bounds worked by hand for a few rows of activations.
TEST(Amx, ChainScalesKeepEverySumNormal) {
  const auto range = [](std::vector<float> x) {
    const detail::ChainScales r = detail::amx_chain_scales(x.data(), x.size());
    return std::pair<int, int>(r.from, r.to);
  };
  // t = -1 (0.5), X = 1: s >= -126 - (t - 8) = -117; s <= floor(log2(2^128 / 192.0007)) = 120.
  EXPECT_EQ(range({1.0f, -0.5f, 0.0f}), std::make_pair(-117 + 127, 120 + 127));
  // Nothing but zeros and subnormals (read as 0): only the codes' own range, s in [-125, 125].
  EXPECT_EQ(range({0.0f, -0.0f, std::ldexp(1.0f, -130)}), std::make_pair(2, 252));
  // X = 2^120: s <= floor(log2(2^8 / 192.0007)) = 0; t = 120 leaves the codes' lower bound.
  EXPECT_EQ(range({std::ldexp(1.0f, 120)}), std::make_pair(2, 127));
  const auto none = [&](std::vector<float> x) {
    const auto [from, to] = range(std::move(x));
    return from > to;
  };
  EXPECT_TRUE(none({1.0f, std::nanf("")}));
  EXPECT_TRUE(none({1.0f, -std::numeric_limits<float>::infinity()}));
  EXPECT_TRUE(none({std::ldexp(1.0f, -119)}));  // its products' quantum 2^-127 is subnormal already
  EXPECT_TRUE(none({std::ldexp(1.0f, 126)}));   // 192 X overflows already
  EXPECT_FALSE(none({std::ldexp(1.0f, -118)}));
}

// The two bf16 arithmetics are different numerics: on the same inputs some
// bits differ (which is why a run compares only with equal products).
TEST(Amx, DiffersFromTheBf16Products) {
  const std::size_t m = 4, n = 32, k = 256;
  const EncodedMatrix encoded = encode(WeightDtype::bf16, test::random_floats(n * k, 9).data(), n, k);
  const std::vector<float> a = test::random_floats(m * k, 10);
  std::vector<float> tiles(m * n), pairs(m * n);
  set_compact_products(CompactProducts::amx);
  gemm_fixed_order(a.data(), m, QuantWeights(encoded), tiles.data());
  set_compact_products(CompactProducts::bf16);
  gemm_fixed_order(a.data(), m, QuantWeights(encoded), pairs.data());
  set_compact_products(CompactProducts::f32);
  EXPECT_NE(std::memcmp(tiles.data(), pairs.data(), tiles.size() * sizeof(float)), 0);
  EXPECT_STREQ(to_string(CompactProducts::amx), "amx");
  if (!cpu_has_amx()) GTEST_SKIP() << "no AMX here: the portable tiles (and the AVX-512 decode tiles) ran";
}

}  // namespace
}  // namespace moed::kernels
