// The int8 dot-product GEMM over int8 experts (int8_dot_gemm.h): the AVX-512
// VNNI tile and the portable loops equal a plain loop of the definition
// written here (per-row 8-bit activations, exact integer sums, two fp32
// multiplies), whatever the batch, the shape's edges and the k range; a row
// with a NaN is NaN alone; and the error against fp32 on the same values is
// the activations' 8-bit rounding.
#include "kernels/cpu/int8_dot_gemm.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "kernels/cpu/bf16_dot_gemm.h"
#include "tests/unit/kernels/dot_gemm_checks.h"
#include "tests/unit/kernels/isas_here.h"
#include "tests/unit/test_support.h"

namespace moed::kernels {
namespace {

// The definition for row x (its range [k0, k1)) against W's row j: int8
// codes in one exact sum, mxfp4's 2 x e2m1 values per 32-step block.
float definition(const EncodedMatrix& e, const float* x, std::size_t j, std::size_t k0, std::size_t k1) {
  float amax = 0;
  for (std::size_t kk = k0; kk < k1; ++kk) {
    if (!std::isfinite(x[kk])) return std::numeric_limits<float>::quiet_NaN();
    amax = std::max(amax, std::fabs(x[kk]));
  }
  const float inv = amax > 0 ? 127.0f / amax : 0.0f;
  auto q = [&](std::size_t kk) { return std::int64_t(std::nearbyint(x[kk] * inv)); };
  if (e.dtype == WeightDtype::int8) {
    std::int64_t acc = 0;
    for (std::size_t kk = k0; kk < k1; ++kk) acc += q(kk) * std::int8_t(e.codes[j * e.k + kk]);
    return float(acc) * (amax / 127.0f) * e.scale(j, 0);
  }
  float total = 0;
  for (std::size_t b = k0; b < k1; b += 32) {
    std::int64_t acc = 0;
    for (std::size_t kk = b; kk < b + 32; ++kk) {
      const std::size_t at = j * e.k + kk;
      acc += q(kk) * std::int64_t(2 * fp4_value(std::uint8_t(e.codes[at / 2] >> (4 * (at % 2)) & 15)));
    }
    total = std::fma(float(acc), e.scale(j, b) / 2, total);
  }
  return total * (amax / 127.0f);
}

struct Case {
  WeightDtype dtype;
  std::size_t m, n, k;
};

class Int8Dot : public ::testing::TestWithParam<Case> {
 protected:
  void SetUp() override { set_compact_products(CompactProducts::int8); }
  void TearDown() override {
    set_compact_products(CompactProducts::f32);
    set_gemm_isa(best_gemm_isa());
  }
};

TEST_P(Int8Dot, EveryKernelIsTheDefinition) {
  const Case c = GetParam();
  const EncodedMatrix e = encode(c.dtype, test::random_floats(c.n * c.k, 51).data(), c.n, c.k);
  const QuantWeights w(e);
  std::vector<float> a = test::random_floats(c.m * c.k, 52);
  if (c.m > 2) {
    a[c.k + 3] = std::numeric_limits<float>::quiet_NaN();  // row 1 is NaN, its neighbours are not
    std::fill(a.begin() + 2 * std::ptrdiff_t(c.k), a.begin() + 3 * std::ptrdiff_t(c.k), 0.0f);  // row 2 is 0
  }
  std::vector<float> want(c.m * c.n);
  for (std::size_t i = 0; i < c.m; ++i)
    for (std::size_t j = 0; j < c.n; ++j) want[i * c.n + j] = definition(e, a.data() + i * c.k, j, 0, c.k);
  const std::size_t grain = column_grain(c.dtype), k0 = c.k / 3 / grain * grain, k1 = (c.k - c.k / 5) / grain * grain;
  const QuantWeights columns(columns_of(e, k0, k1));
  for (GemmIsa isa : test::isas_here()) {
    set_gemm_isa(isa);
    std::vector<float> got(c.m * c.n, -1.0f);
    gemm_fixed_order(a.data(), c.m, w, got.data());
    EXPECT_EQ(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)), 0) << to_string(isa);
    std::vector<float> range(c.m * c.n), alone(c.m * c.n);
    gemm_fixed_order_range(a.data() + k0, c.m, w, k0, k1, range.data(), c.k);
    gemm_fixed_order(a.data() + k0, c.m, columns, alone.data(), c.k);
    EXPECT_EQ(std::memcmp(range.data(), alone.data(), range.size() * sizeof(float)), 0) << to_string(isa) << " range";
    EXPECT_EQ(range[0], definition(e, a.data(), 0, k0, k1)) << to_string(isa);
  }
}

TEST_P(Int8Dot, RowBitsDoNotDependOnTheBatch) {
  const InvarianceProbe probe = probe_row_invariance(GetParam().dtype, GetParam().n, GetParam().k);
  EXPECT_TRUE(probe.invariant) << probe.detail;
}

// Each activation moves by at most half a step of its row's grid (amax /
// 254): the error against fp32 on the same values stays within that.
TEST_P(Int8Dot, ErrorIsTheActivationsRounding) {
  const Case c = GetParam();
  const EncodedMatrix e = encode(c.dtype, test::random_floats(c.n * c.k, 61).data(), c.n, c.k);
  const std::vector<float> values = e.values(), a = test::random_floats(c.m * c.k, 62);
  std::vector<float> got(c.m * c.n);
  gemm_fixed_order(a.data(), c.m, QuantWeights(e), got.data());
  for (std::size_t i = 0; i < c.m; ++i) {
    float amax = 0;
    for (std::size_t kk = 0; kk < c.k; ++kk) amax = std::max(amax, std::fabs(a[i * c.k + kk]));
    for (std::size_t j = 0; j < c.n; ++j) {
      double exact = 0, weights = 0;
      for (std::size_t kk = 0; kk < c.k; ++kk) {
        exact += double(a[i * c.k + kk]) * values[j * c.k + kk];
        weights += std::fabs(double(values[j * c.k + kk]));
      }
      ASSERT_LE(std::fabs(got[i * c.n + j] - exact), weights * amax / 254 * 1.001 + 1e-5) << i << " " << j;
    }
  }
}

std::vector<Case> cases() {
  std::vector<Case> out;
  for (WeightDtype d : {WeightDtype::int8, WeightDtype::mxfp4}) {
    const std::size_t odd_k = d == WeightDtype::mxfp4 ? 320 : 301;  // mxfp4 needs k % 32 == 0
    // One tile; four panels and a partial group of them; mxfp4's fused row
    // blocks (up to 12 rows); more tiles than streaming takes (the blocked
    // path); two row blocks past 256 steps.
    for (Case c : {Case{d, 1, 48, 64}, Case{d, 3, 100, odd_k}, Case{d, 8, 100, odd_k}, Case{d, 13, 100, odd_k},
                   Case{d, 30, 96, odd_k}, Case{d, 300, 40, 544}})
      out.push_back(c);
  }
  return out;
}

INSTANTIATE_TEST_SUITE_P(Shapes, Int8Dot, ::testing::ValuesIn(cases()), [](const auto& info) {
  const Case& c = info.param;
  return fmt::format("{}_{}x{}x{}", to_string(c.dtype), c.m, c.n, c.k);
});

// Every e8m0 scale code reaches mxfp4's outputs as the definition applies
// it: the fused tiles (1 and 3 rows) widen and halve the bytes themselves,
// the prepared tiles (30 rows) take them from e8m0_values.
TEST(Int8Dot, EveryMxScaleCodeApplies) {
  set_compact_products(CompactProducts::int8);
  test::expect_every_mx_scale_code_applies(definition, {1, 3, 30});
  set_compact_products(CompactProducts::f32);
}

// The other compact formats multiply with bf16 products under int8.
TEST(Int8Dot, OtherFormatsTakeBf16Products) {
  const std::size_t m = 3, n = 32, k = 128;
  const QuantWeights w(encode(WeightDtype::fp8, test::random_floats(n * k, 71).data(), n, k));
  const std::vector<float> a = test::random_floats(m * k, 72);
  std::vector<float> as_int8(m * n), as_bf16(m * n);
  set_compact_products(CompactProducts::int8);
  gemm_fixed_order(a.data(), m, w, as_int8.data());
  set_compact_products(CompactProducts::bf16);
  gemm_fixed_order(a.data(), m, w, as_bf16.data());
  set_compact_products(CompactProducts::f32);
  EXPECT_EQ(std::memcmp(as_int8.data(), as_bf16.data(), as_int8.size() * sizeof(float)), 0);
}

}  // namespace
}  // namespace moed::kernels
