// RMSNorm against its double formula; eps keeps a zero row finite.
#include "kernels/cpu/rms_norm.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "common/rng.h"

namespace moed::kernels {
namespace {

// out = x / sqrt(mean(x^2) + eps) * weight, all in double.
std::vector<double> reference(const std::vector<float>& x, const std::vector<float>& weight,
                              std::size_t rows, std::size_t h, float eps) {
  std::vector<double> out(rows * h);
  for (std::size_t r = 0; r < rows; ++r) {
    double ss = 0;
    for (std::size_t i = 0; i < h; ++i) ss += double(x[r * h + i]) * x[r * h + i];
    double scale = 1.0 / std::sqrt(ss / double(h) + double(eps));
    for (std::size_t i = 0; i < h; ++i) out[r * h + i] = x[r * h + i] * scale * weight[i];
  }
  return out;
}

class RmsNorm : public ::testing::TestWithParam<float> {};

TEST_P(RmsNorm, MatchesTheDoubleFormula) {
  const float eps = GetParam();
  const std::size_t h = 37;
  // Row magnitudes from tiny (where eps dominates) to 1e19 (x^2 overflows fp32).
  const std::vector<float> scales = {1e-4f, 1.0f, 3.5f, 1e19f};
  const std::size_t rows = scales.size();
  CounterRng g(5);
  std::vector<float> x(rows * h), weight(h), out(rows * h);
  for (std::size_t r = 0; r < rows; ++r)
    for (std::size_t i = 0; i < h; ++i) x[r * h + i] = g.normalish(r * h + i) * scales[r];
  for (std::size_t i = 0; i < h; ++i) weight[i] = 0.5f + g.uniform(1000 + i);
  rms_norm(x.data(), weight.data(), rows, h, eps, out.data());
  std::vector<double> want = reference(x, weight, rows, h, eps);
  for (std::size_t i = 0; i < rows * h; ++i)
    EXPECT_NEAR(out[i], want[i], 1e-6 * std::abs(want[i])) << "row " << i / h << " col " << i % h;
}

INSTANTIATE_TEST_SUITE_P(Eps, RmsNorm, ::testing::Values(1e-6f, 1e-5f, 1e-2f));

TEST(RmsNorm, EpsIsUsed) {
  // mean(x^2) = 1e-8, eps = 1e-2: the scale is 1/sqrt(0.01000001) ~ 9.9999950, not 1e4.
  const std::vector<float> x = {1e-4f, -1e-4f}, w = {1, 1};
  std::vector<float> out(2);
  rms_norm(x.data(), w.data(), 1, 2, 1e-2f, out.data());
  const double scale = 1.0 / std::sqrt(1e-8 + double(1e-2f));
  EXPECT_NEAR(out[0], 1e-4 * scale, 1e-6 * 1e-3);
  EXPECT_NEAR(out[1], -1e-4 * scale, 1e-6 * 1e-3);
}

TEST(RmsNorm, ZeroRowStaysZero) {
  const std::size_t h = 16;
  std::vector<float> x(2 * h, 0.0f), w(h, 2.0f), out(2 * h, 99.0f);
  for (std::size_t i = 0; i < h; ++i) x[h + i] = float(i) - 7.5f;  // a normal second row
  rms_norm(x.data(), w.data(), 2, h, 1e-6f, out.data());
  for (std::size_t i = 0; i < h; ++i) {
    EXPECT_FALSE(std::isnan(out[i]));
    EXPECT_EQ(out[i], 0.0f) << i;
    EXPECT_TRUE(std::isfinite(out[h + i]));
  }
}

}  // namespace
}  // namespace moed::kernels
