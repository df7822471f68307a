// gemm_xwt (OpenBLAS) against a double loop, and a search for the batch
// dependence that the fixed-order GEMM exists to avoid.
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

#include "tests/unit/test_support.h"

namespace moed::kernels {
namespace {

using test::random_floats;

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

// Why the fixed-order GEMM exists: plain sgemm may round a row differently with
// the batch it sits in. Whether it does depends on the BLAS build and the CPU.
// Why the experts do not run on OpenBLAS by default: a row's bits in a plain
// sgemm depend on the batch it sits in. This OpenBLAS (0.3.21, the one CI
// installs) shows it within the batches searched; the test fails if a BLAS
// stops doing so, so that the README's claim gets revisited.
TEST(GemmXwt, PlainSgemmRowBitsDependOnTheBatch) {
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
            SUCCEED() << "(n " << n << ", k " << k << ") row " << offset + p << " at position " << p
                      << " of a batch of " << m << " rounds differently than alone on " << blas_description();
            return;
          }
      }
  }
  ADD_FAILURE() << "this BLAS (" << blas_description()
                << ") gave every row the same bits in every batch searched: the README's reason for the "
                   "fixed-order GEMM needs another example";
}

}  // namespace
}  // namespace moed::kernels
