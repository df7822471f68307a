// The fixed-order GEMM over compact weights (quant_weights.h): for every
// dtype and instruction set, bit for bit the fp32 GEMM on the weights'
// values, whatever the batch, the row's position, the shape's edges and the
// k range; the panels hold the codes back unchanged.
#include "kernels/cpu/quant_weights.h"

#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "tests/unit/kernels/isas_here.h"
#include "tests/unit/test_support.h"

namespace moed::kernels {
namespace {

using test::isas_here;

struct Case {
  WeightDtype dtype;
  std::size_t m, n, k;
};

class QuantGemm : public ::testing::TestWithParam<Case> {};

TEST_P(QuantGemm, EqualsTheFp32GemmOnTheValues) {
  const Case c = GetParam();
  const EncodedMatrix encoded = encode(c.dtype, test::random_floats(c.n * c.k, 21).data(), c.n, c.k);
  const std::vector<float> values = encoded.values();
  const PackedWeights packed(values.data(), c.n, c.k);
  const QuantWeights quant(encoded);
  EXPECT_EQ(quant.encoded().codes, encoded.codes);
  EXPECT_EQ(quant.encoded().scales, encoded.scales);
  const std::vector<float> a = test::random_floats(c.m * c.k, 22);
  std::vector<float> want(c.m * c.n);
  set_gemm_isa(GemmIsa::portable);
  gemm_fixed_order(a.data(), c.m, packed, want.data());
  for (GemmIsa isa : isas_here()) {
    set_gemm_isa(isa);
    std::vector<float> got(c.m * c.n, -1.0f);
    gemm_fixed_order(a.data(), c.m, quant, got.data());
    EXPECT_EQ(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)), 0) << to_string(isa);
    // A k range (a chunk of a down-projection) is the chain over those columns alone.
    const std::size_t k0 = c.k / 3, k1 = c.k - c.k / 4;
    std::vector<float> range_want(c.m * c.n), range_got(c.m * c.n);
    gemm_fixed_order_range(a.data() + k0, c.m, packed, k0, k1, range_want.data(), c.k);
    gemm_fixed_order_range(a.data() + k0, c.m, quant, k0, k1, range_got.data(), c.k);
    EXPECT_EQ(std::memcmp(range_got.data(), range_want.data(), range_got.size() * sizeof(float)), 0)
        << to_string(isa) << " k range";
  }
  set_gemm_isa(best_gemm_isa());
}

// A row's bits alone and at every position of other batches.
TEST_P(QuantGemm, RowBitsDoNotDependOnTheBatch) {
  const Case c = GetParam();
  const InvarianceProbe probe = probe_row_invariance(c.dtype, c.n, c.k);
  EXPECT_TRUE(probe.invariant) << probe.detail;
}

std::vector<Case> cases() {
  std::vector<Case> out;
  for (WeightDtype d : {WeightDtype::bf16, WeightDtype::fp8, WeightDtype::mxfp4, WeightDtype::int8}) {
    out.push_back({d, 1, 48, 64});
    out.push_back({d, 13, 100, 320});   // a partial panel; fp8: a partial tile along k
    out.push_back({d, 300, 40, 544});   // two row blocks; k past two k blocks
  }
  return out;
}

INSTANTIATE_TEST_SUITE_P(Dtypes, QuantGemm, ::testing::ValuesIn(cases()), [](const auto& info) {
  const Case& c = info.param;
  return fmt::format("{}_{}x{}x{}", to_string(c.dtype), c.m, c.n, c.k);
});

TEST(QuantWeights, BytesAreTheFormatsOwn) {
  const std::size_t n = 256, k = 512;
  const std::vector<float> w = test::random_floats(n * k, 1);
  EXPECT_EQ(QuantWeights(encode(WeightDtype::bf16, w.data(), n, k)).bytes(), 2 * n * k);
  EXPECT_EQ(QuantWeights(encode(WeightDtype::fp8, w.data(), n, k)).bytes(), n * k + 4 * (n / 16) * (k / 128));
  EXPECT_EQ(QuantWeights(encode(WeightDtype::mxfp4, w.data(), n, k)).bytes(), n * k / 2 + n * k / 32);
  EXPECT_EQ(QuantWeights(encode(WeightDtype::int8, w.data(), n, k)).bytes(), n * k + 4 * n);
}

}  // namespace
}  // namespace moed::kernels
