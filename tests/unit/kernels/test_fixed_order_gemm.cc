// The fixed-order GEMM: every kernel gives, bit for bit, the plain std::fma
// chain of its definition, whatever the batch, the row's position, the
// shape's edges and the blocking of k.
#include "kernels/cpu/fixed_order_gemm.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "tests/unit/kernels/isas_here.h"
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

using test::isas_here;

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
                                         Shape{25, 48, 257, 0, 0}, Shape{300, 40, 513, 0, 0}, Shape{14, 80, 530, 0, 90},
                                         Shape{30, 533, 300, 0, 0}, Shape{300, 290, 260, 0, 0},
                                         Shape{13, 300, 40, 310, 310},
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

// The w13 side of a sharded expert: a shard packs only some rows of W (output
// columns of C); each column's bits do not depend on which columns share the
// call, with every kernel.
TEST(FixedOrderGemm, AColumnGivesTheSameBitsWhicheverColumnsShareItsCall) {
  const std::size_t n = 70, k = 290, m = 13;
  const std::vector<float> w = random_floats(n * k, 21), a = random_floats(m * k, 22);
  for (GemmIsa isa : isas_here()) {
    WithIsa pin(isa);
    const PackedWeights whole(w.data(), n, k);
    std::vector<float> all(m * n);
    gemm_fixed_order(a.data(), m, whole, all.data());
    for (auto [first, count] : {std::pair<std::size_t, std::size_t>{0, 35}, {35, 35}, {17, 5}, {69, 1}, {3, 64}}) {
      const PackedWeights part(w.data() + first * k, count, k);
      std::vector<float> c(m * count);
      gemm_fixed_order(a.data(), m, part, c.data());
      for (std::size_t i = 0; i < m; ++i)
        ASSERT_EQ(std::memcmp(c.data() + i * count, all.data() + i * n + first, count * sizeof(float)), 0)
            << to_string(isa) << ": columns [" << first << ", " << first + count << "), row " << i;
    }
  }
}

// The w2 side: a k range of the whole matrix and a matrix packed from just
// those columns give the same bits, equal to the fma chain over the range
// from +0; k ranges across the k blocking (256) included.
TEST(FixedOrderGemm, AKRangeOfAMatrixEqualsTheMatrixOfThoseColumns) {
  const std::size_t n = 37, k = 600, m = 14, lda = 700;
  const std::vector<float> w = random_floats(n * k, 31), a = random_floats(m * lda, 32);
  for (GemmIsa isa : isas_here()) {
    WithIsa pin(isa);
    const PackedWeights whole(w.data(), n, k);
    for (auto [begin, end] : {std::pair<std::size_t, std::size_t>{0, 600}, {0, 150}, {150, 300}, {200, 520},
                              {599, 600}, {300, 300}}) {
      const std::size_t width = end - begin;
      std::vector<float> cols(n * width);
      for (std::size_t j = 0; j < n; ++j)
        std::copy(w.begin() + std::ptrdiff_t(j * k + begin), w.begin() + std::ptrdiff_t(j * k + end),
                  cols.begin() + std::ptrdiff_t(j * width));
      const PackedWeights own(cols.data(), n, width);
      std::vector<float> from_range(m * n, -1.0f), from_own(m * n, -2.0f);
      gemm_fixed_order_range(a.data() + begin, m, whole, begin, end, from_range.data(), lda);
      gemm_fixed_order(a.data() + begin, m, own, from_own.data(), lda);
      std::vector<float> a_range(m * width);
      for (std::size_t i = 0; i < m; ++i)
        std::copy(a.begin() + std::ptrdiff_t(i * lda + begin), a.begin() + std::ptrdiff_t(i * lda + end),
                  a_range.begin() + std::ptrdiff_t(i * width));
      const std::vector<float> want = fma_chain(a_range, m, width, cols, n, width);
      ASSERT_EQ(std::memcmp(from_range.data(), want.data(), want.size() * sizeof(float)), 0)
          << to_string(isa) << ": range [" << begin << ", " << end << ")";
      ASSERT_EQ(std::memcmp(from_own.data(), want.data(), want.size() * sizeof(float)), 0)
          << to_string(isa) << ": own matrix of [" << begin << ", " << end << ")";
    }
  }
}

TEST(FixedOrderGemm, AKRangeOutsideTheMatrixIsRefused) {
  const std::vector<float> w = random_floats(4 * 8, 1), a = random_floats(8, 2);
  const PackedWeights packed(w.data(), 4, 8);
  std::vector<float> c(4);
  test::expect_error([&] { gemm_fixed_order_range(a.data(), 1, packed, 2, 9, c.data()); }, ErrorKind::Internal,
                     {"k range [2, 9)", "k 8"});
  test::expect_error([&] { gemm_fixed_order_range(a.data(), 1, packed, 5, 4, c.data()); }, ErrorKind::Internal,
                     {"k range [5, 4)"});
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
    const PackedWeights copy = packed;  // NOLINT(performance-unnecessary-copy-initialization): under test
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
