// The fixed-order GEMM: every kernel gives, bit for bit, the plain std::fma
// chain of its definition, whatever the batch, the row's position, the
// shape's edges and the blocking of k.
#include "kernels/cpu/fixed_order_gemm.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "tests/unit/test_support.h"

namespace moed::kernels {
namespace {

using test::random_floats;

// The definition: C[i][j] = fma chain over k in order, from +0.
std::vector<float> fma_chain(const std::vector<float>& a, std::size_t m, std::size_t lda,
                             const std::vector<float>& w, std::size_t n, std::size_t k) {
  std::vector<float> c(m * n);
  for (std::size_t i = 0; i < m; ++i)
    for (std::size_t j = 0; j < n; ++j) {
      float acc = 0.0f;
      for (std::size_t kk = 0; kk < k; ++kk) acc = std::fma(a[i * lda + kk], w[j * k + kk], acc);
      c[i * n + j] = acc;
    }
  return c;
}

std::vector<GemmIsa> isas_here() {
  std::vector<GemmIsa> out{GemmIsa::portable};
  for (GemmIsa isa : {GemmIsa::avx2, GemmIsa::avx512}) {
    try {
      set_gemm_isa(isa);
      out.push_back(isa);
    } catch (const std::exception&) {
    }
  }
  set_gemm_isa(best_gemm_isa());
  return out;
}

// Restores the kernel the process started with.
class WithIsa {
 public:
  explicit WithIsa(GemmIsa isa) { set_gemm_isa(isa); }
  ~WithIsa() { set_gemm_isa(best_gemm_isa()); }
};

struct Shape {
  std::size_t m, n, k, lda, ldc;
};

class FixedOrderGemm : public ::testing::TestWithParam<std::tuple<GemmIsa, Shape>> {};

TEST_P(FixedOrderGemm, EqualsTheFmaChainBitForBit) {
  const auto [isa, s] = GetParam();
  WithIsa pin(isa);
  const std::size_t lda = s.lda ? s.lda : s.k, ldc = s.ldc ? s.ldc : s.n;
  std::vector<float> a = random_floats(std::max<std::size_t>(s.m * lda, 1), 11 + s.k);
  // Columns past k in A's rows are never read: poison them.
  for (std::size_t r = 0; r < s.m; ++r)
    for (std::size_t j = s.k; j < lda; ++j) a[r * lda + j] = std::numeric_limits<float>::quiet_NaN();
  const std::vector<float> w = random_floats(s.n * s.k, 12 + s.n);
  const PackedWeights packed(w.data(), s.n, s.k);
  const float sentinel = 12345.0f;
  std::vector<float> c(s.m * ldc + 1, sentinel);
  gemm_fixed_order(a.data(), s.m, packed, c.data(), s.lda, s.ldc);
  const std::vector<float> want = fma_chain(a, s.m, lda, w, s.n, s.k);
  for (std::size_t i = 0; i < s.m; ++i) {
    ASSERT_EQ(std::memcmp(c.data() + i * ldc, want.data() + i * s.n, s.n * sizeof(float)), 0)
        << to_string(isa) << ": row " << i;
    for (std::size_t j = s.n; j < ldc; ++j) ASSERT_EQ(c[i * ldc + j], sentinel) << "wrote past n in row " << i;
  }
  EXPECT_EQ(c[s.m * ldc], sentinel);
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, FixedOrderGemm,
    ::testing::Combine(::testing::ValuesIn(isas_here()),
                       ::testing::Values(Shape{0, 5, 7, 0, 0}, Shape{1, 1, 1, 0, 0}, Shape{3, 5, 7, 0, 0},
                                         Shape{7, 16, 16, 0, 0}, Shape{13, 33, 65, 0, 0},
                                         Shape{6, 17, 300, 310, 20}, Shape{12, 64, 256, 0, 0},
                                         Shape{25, 48, 257, 0, 0}, Shape{300, 40, 513, 0, 0},
                                         Shape{4, 3, 0, 0, 0})),
    [](const auto& info) {
      const Shape& s = std::get<1>(info.param);
      return to_string(std::get<0>(info.param)) + "_m" + std::to_string(s.m) + "_n" + std::to_string(s.n) + "_k" +
             std::to_string(s.k) + (s.lda ? "_strided" : "");
    });

// The same row alone, and at every position of batches of every size up to
// past the row blocking: the same bits, with every kernel.
TEST(FixedOrderGemm, ARowGivesTheSameBitsInAnyBatchWithAnyKernel) {
  const std::size_t n = 40, k = 300, most = 300;
  const std::vector<float> w = random_floats(n * k, 3), row = random_floats(k, 4), others = random_floats(most * k, 5);
  const PackedWeights packed(w.data(), n, k);
  std::vector<float> alone(n);
  gemm_fixed_order(row.data(), 1, packed, alone.data());
  for (GemmIsa isa : isas_here()) {
    WithIsa pin(isa);
    for (std::size_t m : {1, 2, 5, 6, 7, 11, 12, 13, 24, 97, 289, 300}) {
      std::vector<float> c(m * n);
      for (std::size_t pos = 0; pos < m; pos += (m > 30 ? 13 : 1)) {
        std::vector<float> batch(others.begin(), others.begin() + std::ptrdiff_t(m * k));
        std::copy(row.begin(), row.end(), batch.begin() + std::ptrdiff_t(pos * k));
        gemm_fixed_order(batch.data(), m, packed, c.data());
        ASSERT_EQ(std::memcmp(c.data() + pos * n, alone.data(), n * sizeof(float)), 0)
            << to_string(isa) << ": position " << pos << " of " << m;
      }
    }
  }
}

TEST(FixedOrderGemm, SpecialValuesFollowTheChain) {
  // -0 products from +0 give +0; inf and NaN propagate as fma does.
  const std::size_t n = 3, k = 2;
  const std::vector<float> w{-1.0f, 0.0f, std::numeric_limits<float>::infinity(), 1.0f, 1.0f, 1.0f};
  const std::vector<float> a{0.0f, 0.0f, 1.0f, std::numeric_limits<float>::quiet_NaN()};
  const PackedWeights packed(w.data(), n, k);
  for (GemmIsa isa : isas_here()) {
    WithIsa pin(isa);
    std::vector<float> c(2 * n);
    gemm_fixed_order(a.data(), 2, packed, c.data());
    EXPECT_FALSE(std::signbit(c[0])) << to_string(isa);  // fma(0, -1, +0) = +0
    EXPECT_TRUE(std::isnan(c[1 * n + 0])) << to_string(isa);
    EXPECT_TRUE(std::isnan(c[1 * n + 1])) << to_string(isa);
  }
}

TEST(PackedWeights, UnpackGivesTheMatrixBack) {
  for (auto [n, k] : {std::pair<std::size_t, std::size_t>{1, 1}, {17, 5}, {32, 64}, {5, 0}}) {
    const std::vector<float> w = random_floats(n * k, 9);
    const PackedWeights packed(w.data(), n, k);
    EXPECT_EQ(packed.panels(), (n + 15) / 16);
    EXPECT_EQ(reinterpret_cast<std::uintptr_t>(packed.panel(0)) % 64, 0u);
    std::vector<float> back(n * k, -1.0f);
    packed.unpack(back.data());
    EXPECT_EQ(back, w) << n << " x " << k;
    const PackedWeights copy = packed;
    std::vector<float> again(n * k, -1.0f);
    copy.unpack(again.data());
    EXPECT_EQ(again, w);
  }
}

TEST(FixedOrderGemm, StartUpProbeHoldsOnThisCpu) {
  for (GemmIsa isa : isas_here()) {
    WithIsa pin(isa);
    const InvarianceProbe probe = probe_row_invariance(40, 300);
    EXPECT_TRUE(probe.invariant) << probe.detail;
  }
}

TEST(FixedOrderGemm, AKernelThisCpuLacksIsRefused) {
  if (best_gemm_isa() == GemmIsa::avx512) GTEST_SKIP() << "this CPU runs every kernel";
  EXPECT_THROW(set_gemm_isa(GemmIsa::avx512), std::exception);
}

}  // namespace
}  // namespace moed::kernels
