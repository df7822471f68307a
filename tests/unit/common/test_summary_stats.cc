// Summary statistics: percentiles by linear interpolation between order
// statistics, mean and spread, on hand-computed cases.
#include "common/summary_stats.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace moed {
namespace {

struct PercentileCase {
  std::vector<double> samples;
  double q;
  double want;
};

void PrintTo(const PercentileCase& c, std::ostream* os) {
  *os << "q " << c.q << " of " << ::testing::PrintToString(c.samples);
}

class Percentile : public ::testing::TestWithParam<PercentileCase> {};

TEST_P(Percentile, InterpolatesBetweenOrderStatistics) {
  const auto& c = GetParam();
  EXPECT_DOUBLE_EQ(percentile(c.samples, c.q), c.want);
}

INSTANTIATE_TEST_SUITE_P(
    HandComputed, Percentile,
    ::testing::Values(
        PercentileCase{{}, 0.5, 0.0},                  // no samples
        PercentileCase{{7}, 0.0, 7}, PercentileCase{{7}, 0.3, 7}, PercentileCase{{7}, 1.0, 7},
        PercentileCase{{1, 2, 3, 4}, 0.0, 1},           // q = 0: the minimum
        PercentileCase{{1, 2, 3, 4}, 1.0, 4},           // q = 1: the maximum
        PercentileCase{{1, 2, 3, 4}, 0.5, 2.5},         // position 1.5
        PercentileCase{{1, 2, 3, 4}, 0.25, 1.75},       // position 0.75
        PercentileCase{{10, 0, 5}, 0.5, 5},             // unsorted input
        PercentileCase{{10, 0, 5}, 0.75, 7.5},          // position 1.5 of {0, 5, 10}
        PercentileCase{{1, 2, 3, 4, 5}, 0.9, 4.6},      // position 3.6
        PercentileCase{{-3, 100}, 0.1, -3 + 0.1 * 103}, // position 0.1
        PercentileCase{{2, 2, 2, 9}, 0.5, 2}));

TEST(Percentile, DoesNotReorderTheCallersSamples) {
  std::vector<double> v{3, 1, 2};
  percentile(v, 0.5);
  EXPECT_EQ(v, (std::vector<double>{3, 1, 2}));
}

TEST(SummaryStats, Mean) {
  EXPECT_DOUBLE_EQ(mean({1, 2, 3, 4}), 2.5);
  EXPECT_DOUBLE_EQ(mean({-1, 1}), 0.0);
  EXPECT_DOUBLE_EQ(mean({5}), 5.0);
  EXPECT_DOUBLE_EQ(mean({}), 0.0);
}

struct SpreadCase {
  std::vector<double> v;
  double std_over_mean, max_over_mean;
};

void PrintTo(const SpreadCase& c, std::ostream* os) { *os << ::testing::PrintToString(c.v); }

class Spread : public ::testing::TestWithParam<SpreadCase> {};

TEST_P(Spread, MatchesHandComputedValues) {
  const auto& c = GetParam();
  EXPECT_DOUBLE_EQ(std_over_mean(c.v), c.std_over_mean);
  EXPECT_DOUBLE_EQ(max_over_mean(c.v), c.max_over_mean);
}

INSTANTIATE_TEST_SUITE_P(
    HandComputed, Spread,
    ::testing::Values(
        // Mean 5; squared deviations 9,1,1,1,0,0,4,16 sum to 32; population std sqrt(32/8) = 2.
        SpreadCase{{2, 4, 4, 4, 5, 5, 7, 9}, 0.4, 9.0 / 5.0},
        SpreadCase{{1, 3}, 0.5, 1.5},            // mean 2, std 1
        SpreadCase{{3, 3, 3}, 0.0, 1.0},         // no spread
        SpreadCase{{6}, 0.0, 1.0},
        SpreadCase{{-1, 1}, 0.0, 0.0},           // zero mean -> 0
        SpreadCase{{0, 0, 0}, 0.0, 0.0}));

}  // namespace
}  // namespace moed
