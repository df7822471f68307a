// The bf16 dot-product GEMM over compact weights (bf16_dot_gemm.h): the
// AVX-512 BF16 kernels equal the portable loops bit for bit, and both equal
// a plain loop written here from the definition (activations rounded to
// bf16, vdpbf16ps's pair steps, scales on the blocks' partial sums); a row's
// bits do not depend on its batch; a k range is the matrix of those columns;
// the error against fp32 on the same values stays within bf16's rounding.
#include "kernels/cpu/bf16_dot_gemm.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

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

// The definition, one output at a time: columns [k0, k1) of row i of x (x
// holds the whole row) against W's row j.
float definition(const EncodedMatrix& e, const float* x, std::size_t j, std::size_t k0, std::size_t k1) {
  const std::size_t block = e.dtype == WeightDtype::fp8 ? 128 : e.dtype == WeightDtype::mxfp4 ? 32 : 0;
  auto xb = [&](std::size_t kk) { return kk < k1 ? flushed(bf16_value(bf16_code(x[kk]))) : 0.0f; };
  auto wv = [&](std::size_t kk) { return kk < k1 ? flushed(code_value(e, j, kk)) : 0.0f; };
  auto chain = [&](std::size_t from, std::size_t to) {
    float acc = 0.0f;
    for (std::size_t kk = from; kk < to; kk += 2) {
      acc = flushed(std::fma(xb(kk + 1), wv(kk + 1), acc));
      acc = flushed(std::fma(xb(kk), wv(kk), acc));
    }
    return acc;
  };
  if (block == 0) {
    const float sum = chain(k0, k1);
    return e.dtype == WeightDtype::int8 ? sum * e.scale(j, 0) : sum;
  }
  float total = 0.0f;
  for (std::size_t b = k0; b < k1; b += block) total = std::fma(chain(b, std::min(k1, b + block)), e.scale(j, b), total);
  return total;
}

class Bf16Dot : public ::testing::TestWithParam<Case> {
 protected:
  void SetUp() override { set_compact_products(CompactProducts::bf16); }
  void TearDown() override {
    set_compact_products(CompactProducts::f32);
    set_gemm_isa(best_gemm_isa());
  }
};

TEST_P(Bf16Dot, EveryKernelIsTheDefinition) {
  const Case c = GetParam();
  test::expect_every_kernel_is(definition, c.dtype, c.m, c.n, c.k);
}

TEST_P(Bf16Dot, RowBitsDoNotDependOnTheBatch) {
  const Case c = GetParam();
  const InvarianceProbe probe = probe_row_invariance(c.dtype, c.n, c.k);  // the products set above
  EXPECT_TRUE(probe.invariant) << probe.detail;
}

TEST_P(Bf16Dot, ErrorIsBf16Rounding) {
  const Case c = GetParam();
  test::expect_error_within_bf16_rounding(c.dtype, c.m, c.n, c.k);
}

std::vector<Case> cases() {
  std::vector<Case> out;
  for (WeightDtype d : {WeightDtype::bf16, WeightDtype::fp8, WeightDtype::mxfp4, WeightDtype::int8}) {
    const std::size_t odd_k = d == WeightDtype::mxfp4 ? 320 : 301;  // mxfp4 needs k % 32 == 0
    out.push_back({d, 1, 48, 64});
    // The fused tiles at every panel grouping (4, 2, 1 panels; 100 columns
    // leave panels over, and a partial one), then two fused row blocks.
    for (std::size_t m : {3, 5, 9, 20}) out.push_back({d, m, 100, odd_k});
    out.push_back({d, 30, 100, odd_k});   // the decoded-buffer tiles: a partial panel; an odd k
    out.push_back({d, 300, 40, 544});     // two row blocks; three k blocks
  }
  return out;
}

INSTANTIATE_TEST_SUITE_P(Dtypes, Bf16Dot, ::testing::ValuesIn(cases()), [](const auto& info) {
  const Case& c = info.param;
  return fmt::format("{}_{}x{}x{}", to_string(c.dtype), c.m, c.n, c.k);
});

// Every code of every format decodes to its exact value, the AVX-512 byte
// and word permutes as the portable loop: all 256 fp8 and int8 codes (but
// NaN and -128), all 16 fp4 nibbles, bf16 including -0 and subnormals.
TEST(Bf16Dot, EveryCodeDecodes) {
  set_compact_products(CompactProducts::bf16);
  const std::size_t n = 16, k = 256;
  for (WeightDtype d : {WeightDtype::bf16, WeightDtype::fp8, WeightDtype::mxfp4, WeightDtype::int8}) {
    EncodedMatrix e = encode(d, test::random_floats(n * k, 5).data(), n, k);
    for (std::size_t b = 0; b < e.codes.size(); ++b) {
      std::uint8_t code = std::uint8_t(b * 7 + b / 256);
      if (d == WeightDtype::fp8 && fp8_is_nan(code)) code = 0x80;  // -0
      if (d == WeightDtype::int8 && code == 0x80) code = 0x81;
      e.codes[b] = code;
    }
    const QuantWeights quant(e);
    std::vector<float> a(k, 0.0f), want(n), got(n);
    for (std::size_t kk = 0; kk < k; ++kk) {  // one column at a time: the output is the code's value x scale
      std::fill(a.begin(), a.end(), 0.0f);
      a[kk] = 1.0f;
      for (std::size_t j = 0; j < n; ++j) want[j] = definition(e, a.data(), j, 0, k);
      for (GemmIsa isa : isas_here()) {
        set_gemm_isa(isa);
        gemm_fixed_order(a.data(), 1, quant, got.data());
        ASSERT_EQ(std::memcmp(got.data(), want.data(), n * sizeof(float)), 0)
            << to_string(d) << " column " << kk << " " << to_string(isa);
      }
    }
  }
  set_compact_products(CompactProducts::f32);
  set_gemm_isa(best_gemm_isa());
}

// Every e8m0 scale code reaches the outputs as the definition applies it:
// the fused tiles widen mxfp4's scale bytes themselves (0 is 2^-127, 255
// NaN), the buffered tiles take them from block_scales. 1 and 4 rows (the
// fused tiles), 30 (the buffered ones); the NaN blocks' columns are NaN.
TEST(Bf16Dot, EveryMxScaleCodeApplies) {
  set_compact_products(CompactProducts::bf16);
  test::expect_every_mx_scale_code_applies(definition, {1, 4, 30});
  set_compact_products(CompactProducts::f32);
}

TEST(Bf16Dot, HardwareIsNamed) {
  EXPECT_STREQ(to_string(CompactProducts::bf16), "bf16");
  EXPECT_STREQ(to_string(CompactProducts::f32), "f32");
  if (!cpu_has_bf16_dot()) GTEST_SKIP() << "no AVX-512 BF16 here: only the portable loops ran";
}

}  // namespace
}  // namespace moed::kernels
