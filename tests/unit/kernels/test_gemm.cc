// gemm_xwt against a double loop, and the row-batch invariance that
// InvariantRowGemm exists for (which plain sgemm does not give).
#include "kernels/cpu/gemm.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "common/rng.h"

namespace moed::kernels {
namespace {

std::vector<float> random_floats(std::size_t n, std::uint64_t key) {
  CounterRng g(key);
  std::vector<float> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = g.symmetric(i);
  return v;
}

bool same_bits(const float* a, const float* b, std::size_t n) {
  return std::memcmp(a, b, n * sizeof(float)) == 0;
}

struct GemmShape {
  std::size_t m, n, k, lda;
};

void PrintTo(const GemmShape& s, std::ostream* os) {
  *os << "m " << s.m << " n " << s.n << " k " << s.k << " lda " << s.lda;
}

class GemmXwt : public ::testing::TestWithParam<GemmShape> {};

TEST_P(GemmXwt, MatchesADoubleLoop) {
  const auto [m, n, k, lda_arg] = GetParam();
  const std::size_t lda = lda_arg ? lda_arg : k;
  std::vector<float> a = random_floats(std::max<std::size_t>(m * lda, 1), 11);
  // Columns past k in each row of A must not be read: make them poison.
  for (std::size_t r = 0; r < m; ++r)
    for (std::size_t j = k; j < lda; ++j) a[r * lda + j] = std::numeric_limits<float>::quiet_NaN();
  std::vector<float> w = random_floats(n * k, 12);
  const float sentinel = 12345.0f;
  std::vector<float> c(m * n + 1, sentinel);  // one past the end stays untouched
  gemm_xwt(a.data(), m, k, w.data(), n, c.data(), lda_arg);
  for (std::size_t i = 0; i < m; ++i)
    for (std::size_t j = 0; j < n; ++j) {
      double ref = 0, magnitude = 0;
      for (std::size_t p = 0; p < k; ++p) {
        ref += double(a[i * lda + p]) * double(w[j * k + p]);
        magnitude += std::abs(double(a[i * lda + p]) * double(w[j * k + p]));
      }
      // Relative to the sum of |terms|: the scale of fp32 rounding, safe under cancellation.
      EXPECT_NEAR(c[i * n + j], ref, 1e-5 * magnitude + 1e-30) << "row " << i << " col " << j;
    }
  EXPECT_EQ(c[m * n], sentinel);
}

INSTANTIATE_TEST_SUITE_P(Shapes, GemmXwt,
                         ::testing::Values(GemmShape{0, 5, 7, 0}, GemmShape{1, 1, 1, 0},
                                           GemmShape{3, 5, 7, 0}, GemmShape{17, 33, 65, 0},
                                           GemmShape{5, 8, 16, 20}, GemmShape{64, 64, 128, 0},
                                           GemmShape{9, 3, 300, 310}));

class InvariantRows : public ::testing::TestWithParam<std::pair<std::size_t, std::size_t>> {};

// A row's bits depend on nothing but the row: not on the batch, its size, or
// the row's position in it.
TEST_P(InvariantRows, RowBitsDoNotDependOnTheBatch) {
  const auto [n, k] = GetParam();
  const std::size_t rows = 37;
  std::vector<float> w = random_floats(n * k, 21 + n + k);
  std::vector<float> a = random_floats(rows * k, 22 + n + k);
  InvariantRowGemm gemm(w.data(), n, k);

  std::vector<float> all(rows * n);
  gemm(a.data(), rows, all.data());
  // The result is also correct, not just stable.
  for (std::size_t j = 0; j < n; ++j) {
    double ref = 0, magnitude = 0;
    for (std::size_t p = 0; p < k; ++p) {
      ref += double(a[5 * k + p]) * w[j * k + p];
      magnitude += std::abs(double(a[5 * k + p]) * w[j * k + p]);
    }
    EXPECT_NEAR(all[5 * n + j], ref, 1e-5 * magnitude);
  }

  std::vector<float> one(n);
  for (std::size_t r = 0; r < rows; ++r) {
    gemm(a.data() + r * k, 1, one.data());
    EXPECT_TRUE(same_bits(one.data(), all.data() + r * n, n)) << "row " << r << " alone";
  }
  // Batches at various offsets and sizes, and the whole set cut into uneven chunks.
  std::vector<std::pair<std::size_t, std::size_t>> batches = {{3, 20}, {0, 1}, {5, 37}, {36, 37},
                                                              {1, 10}, {8, 17}, {0, 37}};
  for (std::size_t start = 0, size = 1; start < rows; start += size, size = size % 9 + 1)
    batches.push_back({start, std::min(rows, start + size)});
  for (const auto& [begin, end] : batches) {
    std::vector<float> part((end - begin) * n);
    gemm(a.data() + begin * k, end - begin, part.data());
    for (std::size_t r = begin; r < end; ++r)
      EXPECT_TRUE(same_bits(part.data() + (r - begin) * n, all.data() + r * n, n))
          << "row " << r << " in batch [" << begin << ", " << end << ")";
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, InvariantRows,
                         ::testing::Values(std::pair<std::size_t, std::size_t>{8, 64},
                                           std::pair<std::size_t, std::size_t>{8, 1024},
                                           std::pair<std::size_t, std::size_t>{64, 64},
                                           std::pair<std::size_t, std::size_t>{64, 1024}),
                         [](const auto& info) {
                           return "n" + std::to_string(info.param.first) + "_k" +
                                  std::to_string(info.param.second);
                         });

TEST(InvariantRowGemm, ZeroRowsWritesNothing) {
  std::vector<float> w = random_floats(8 * 16, 3);
  InvariantRowGemm gemm(w.data(), 8, 16);
  float c = 7.0f;
  gemm(nullptr, 0, &c);
  EXPECT_EQ(c, 7.0f);
}

TEST(ProbeInvariantTile, ReturnsAPowerOfTwoUpToEight) {
  for (auto [k, n] : {std::pair<std::size_t, std::size_t>{64, 8}, {1024, 8}, {64, 64}, {1024, 64},
                      {4096, 8}}) {
    std::size_t tile = probe_invariant_tile(k, n);
    EXPECT_TRUE(tile == 8 || tile == 4 || tile == 2 || tile == 1) << tile;
    std::vector<float> w(n * k, 0.5f);
    EXPECT_EQ(InvariantRowGemm(w.data(), n, k).tile_rows(), tile) << "k " << k << " n " << n;
  }
}

// Why InvariantRowGemm exists: plain sgemm may round a row differently with the
// batch it sits in. Whether it does depends on the BLAS build and the CPU.
TEST(GemmXwt, PlainSgemmRowBitsMayDependOnTheBatch) {
  const std::size_t max_rows = 40;
  for (auto [n, k] : {std::pair<std::size_t, std::size_t>{8, 1024}, {64, 1024}, {8, 64}}) {
    std::vector<float> w = random_floats(n * k, 31);
    std::vector<float> a = random_floats(max_rows * k, 32);
    std::vector<float> alone(max_rows * n);
    for (std::size_t r = 0; r < max_rows; ++r)
      gemm_xwt(a.data() + r * k, 1, k, w.data(), n, alone.data() + r * n);
    for (std::size_t m = 2; m <= max_rows; ++m)
      for (std::size_t offset : {std::size_t(0), max_rows - m}) {
        std::vector<float> c(m * n);
        gemm_xwt(a.data() + offset * k, m, k, w.data(), n, c.data());
        for (std::size_t p = 0; p < m; ++p)
          if (!same_bits(c.data() + p * n, alone.data() + (offset + p) * n, n)) {
            std::printf("found: (n %zu, k %zu) row %zu at position %zu of a batch of %zu rounds "
                        "differently than alone on %s\n",
                        n, k, offset + p, p, m, blas_description().c_str());
            return;
          }
      }
  }
  GTEST_SKIP() << "this BLAS (" << blas_description()
               << ") gave every row the same bits in every batch searched";
}

}  // namespace
}  // namespace moed::kernels
