#include "common/recent_samples.h"

#include <gtest/gtest.h>

namespace moed {
namespace {

TEST(RecentSamples, EmptyIsZero) {
  RecentSamples r(4);
  EXPECT_EQ(r.size(), 0u);
  EXPECT_EQ(r.sum(), 0);
  EXPECT_EQ(r.quantile(0.99), 0);
}

TEST(RecentSamples, KeepsOnlyTheLastCapacity) {
  RecentSamples r(3);
  for (double v : {100.0, 1.0, 2.0, 3.0}) r.add(v);  // 100 has left
  EXPECT_EQ(r.size(), 3u);
  EXPECT_DOUBLE_EQ(r.sum(), 6);
  EXPECT_DOUBLE_EQ(r.quantile(1.0), 3);
  for (int i = 0; i < 1000; ++i) r.add(7);
  EXPECT_EQ(r.size(), 3u);
  EXPECT_DOUBLE_EQ(r.sum(), 21);
}

struct QuantileCase {
  double q, want;
};
class RecentQuantile : public ::testing::TestWithParam<QuantileCase> {};

TEST_P(RecentQuantile, NearestRank) {
  RecentSamples r(100);
  for (int v = 100; v >= 1; --v) r.add(v);  // 1..100, added out of order
  EXPECT_DOUBLE_EQ(r.quantile(GetParam().q), GetParam().want);
}

INSTANTIATE_TEST_SUITE_P(Ranks, RecentQuantile,
                         ::testing::Values(QuantileCase{0.0, 1}, QuantileCase{0.01, 1}, QuantileCase{0.5, 50},
                                           QuantileCase{0.99, 99}, QuantileCase{0.995, 100},
                                           QuantileCase{1.0, 100}));

}  // namespace
}  // namespace moed
