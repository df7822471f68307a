// Streaming quantiles: against exact nearest-rank quantiles of the same
// samples, within the stated relative error, in memory that does not grow.
#include "common/quantile_histogram.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

namespace moed {
namespace {

double nearest_rank(std::vector<double> v, double q) {
  std::sort(v.begin(), v.end());
  auto rank = std::max<std::size_t>(1, std::size_t(std::ceil(q * double(v.size()))));
  return v[rank - 1];
}

TEST(QuantileHistogram, EmptyGivesZeros) {
  QuantileHistogram h;
  EXPECT_EQ(h.count(), 0u);
  EXPECT_EQ(h.quantile(0.5), 0.0);
  EXPECT_EQ(h.min(), 0.0);
  EXPECT_EQ(h.max(), 0.0);
}

TEST(QuantileHistogram, OneSampleIsExact) {
  QuantileHistogram h;
  h.add(0.1234);
  EXPECT_EQ(h.quantile(0.0), 0.1234);
  EXPECT_EQ(h.quantile(0.5), 0.1234);
  EXPECT_EQ(h.quantile(1.0), 0.1234);
}

TEST(QuantileHistogram, ExtremesAreExact) {
  QuantileHistogram h;
  for (double v : {0.2, 0.1, 0.4}) h.add(v);
  EXPECT_EQ(h.quantile(1.0), 0.4);
  EXPECT_EQ(h.quantile(0.99), 0.4);  // rank ceil(2.97) = 3
  EXPECT_EQ(h.quantile(0.0), 0.1);
  EXPECT_NEAR(h.quantile(0.5), 0.2, 0.2 * QuantileHistogram::relative_error());
  EXPECT_NEAR(h.sum(), 0.7, 1e-15);
}

struct Distribution {
  const char* name;
  double (*draw)(std::mt19937_64&);
};

class QuantileAccuracy : public ::testing::TestWithParam<Distribution> {};

TEST_P(QuantileAccuracy, WithinTheStatedRelativeError) {
  std::mt19937_64 rng(7);
  QuantileHistogram h;
  std::vector<double> samples;
  for (int i = 0; i < 20000; ++i) {
    double v = GetParam().draw(rng);
    samples.push_back(v);
    h.add(v);
  }
  for (double q : {0.01, 0.1, 0.5, 0.9, 0.99, 0.999}) {
    double want = nearest_rank(samples, q);
    EXPECT_NEAR(h.quantile(q), want, want * QuantileHistogram::relative_error() * 1.0001) << "q " << q;
  }
}

INSTANTIATE_TEST_SUITE_P(
    Distributions, QuantileAccuracy,
    ::testing::Values(
        Distribution{"uniform_ms", [](std::mt19937_64& r) { return std::uniform_real_distribution(1e-3, 2e-3)(r); }},
        Distribution{"lognormal", [](std::mt19937_64& r) { return std::lognormal_distribution(-5.0, 1.5)(r); }},
        Distribution{"microseconds", [](std::mt19937_64& r) { return std::exponential_distribution(1e5)(r) + 1e-6; }},
        Distribution{"minutes", [](std::mt19937_64& r) { return std::uniform_real_distribution(60.0, 600.0)(r); }}),
    [](const auto& info) { return std::string(info.param.name); });

TEST(QuantileHistogram, OutOfRangeValuesLandInTheEndBuckets) {
  QuantileHistogram h;
  h.add(0.0);
  h.add(-1.0);
  h.add(1e9);
  EXPECT_EQ(h.count(), 3u);
  EXPECT_EQ(h.quantile(0.0), -1.0);  // clamped to the exact minimum
  EXPECT_EQ(h.quantile(1.0), 1e9);   // and maximum
  EXPECT_LT(h.quantile(0.5), 1e-6);  // zero sits in the first bucket
}

TEST(QuantileHistogram, SizeDoesNotDependOnSamples) {
  // The whole state is a fixed array: the type's size is the memory it uses.
  static_assert(sizeof(QuantileHistogram) < 24 * 1024);
  EXPECT_LT(QuantileHistogram::relative_error(), 0.006);
}

}  // namespace
}  // namespace moed
