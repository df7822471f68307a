// The router's shared arithmetic (kernels/cpu/router_body.h): route_exp
// against the C library's exp, its edges, and the ranking order's laws.
#include "kernels/cpu/router_body.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

namespace moed::kernels {
namespace {

using detail::ranks_before;
using detail::route_exp;

// Units in the last place between two positive doubles.
double ulps_apart(double a, double b) {
  return std::fabs(a - b) / (std::nextafter(b, HUGE_VAL) - b);
}

TEST(RouteExp, WithinTwoUlpsOfTheLibraryWhereNormal) {
  std::mt19937_64 rng(7);
  std::uniform_real_distribution<double> wide(-708.0, 709.7), near_zero(-1.0, 1.0), tiny(-1e-10, 1e-10);
  double worst = 0;
  for (int i = 0; i < 300000; ++i) {
    for (double x : {wide(rng), near_zero(rng), tiny(rng)}) {
      const double ulps = ulps_apart(route_exp(x), std::exp(x));
      worst = std::max(worst, ulps);
      ASSERT_LE(ulps, 2.0) << "x = " << x;
    }
  }
  // Every multiple of ln2 / 2 over the range: the reduction's boundaries.
  for (int j = -2040; j <= 2046; ++j) {
    const double x = j * 0.34657359027997264;
    ASSERT_LE(ulps_apart(route_exp(x), std::exp(x)), 2.0) << "x = " << x;
  }
  RecordProperty("worst_ulps", std::to_string(worst));
}

TEST(RouteExp, EdgesAndSpecialValues) {
  const double inf = std::numeric_limits<double>::infinity();
  EXPECT_EQ(route_exp(0.0), 1.0);
  EXPECT_EQ(route_exp(-0.0), 1.0);
  EXPECT_EQ(route_exp(inf), inf);
  EXPECT_EQ(route_exp(-inf), 0.0);
  EXPECT_TRUE(std::isnan(route_exp(std::numeric_limits<double>::quiet_NaN())));
  EXPECT_EQ(route_exp(710.0), inf);
  EXPECT_EQ(route_exp(-746.0), 0.0);
  EXPECT_TRUE(std::isfinite(route_exp(709.78)));
  EXPECT_LE(ulps_apart(route_exp(709.78), std::exp(709.78)), 2.0);
  // Subnormal results: within one of their (fixed) quanta.
  const double quantum = std::numeric_limits<double>::denorm_min();
  for (double x = -745.0; x < -708.5; x += 0.37) {
    ASSERT_LE(std::fabs(route_exp(x) - std::exp(x)), std::max(quantum, 2e-16 * std::exp(x))) << "x = " << x;
  }
  EXPECT_GT(route_exp(-745.0), 0.0);
}

TEST(RouteExp, NonDecreasingAcrossTheReductionsBoundaries) {
  // A softmax ranks as its logits rank only if exp never steps down.
  for (int j = -2040; j <= 2046; ++j) {
    double x = j * 0.34657359027997264;
    for (int step = -40; step < 40; ++step) {
      const double a = x + step * 1e-13, b = std::nextafter(a, HUGE_VAL);
      ASSERT_LE(route_exp(a), route_exp(b)) << "at " << a;
    }
  }
}

TEST(RanksBefore, IsAStrictTotalOrderOnDistinctIds) {
  const double nan = std::numeric_limits<double>::quiet_NaN(), inf = std::numeric_limits<double>::infinity();
  const std::vector<double> scores = {0.5, 0.5, nan, -inf, inf, 0.25, nan, 0.5, -0.0, 0.0};
  const auto n = std::uint32_t(scores.size());
  for (std::uint32_t a = 0; a < n; ++a) {
    EXPECT_FALSE(ranks_before(scores[a], a, scores[a], a));
    for (std::uint32_t b = 0; b < n; ++b) {
      if (a == b) continue;
      // Exactly one of a, b first.
      EXPECT_NE(ranks_before(scores[a], a, scores[b], b), ranks_before(scores[b], b, scores[a], a)) << a << " " << b;
      for (std::uint32_t c = 0; c < n; ++c) {
        if (ranks_before(scores[a], a, scores[b], b) && ranks_before(scores[b], b, scores[c], c)) {
          EXPECT_TRUE(ranks_before(scores[a], a, scores[c], c)) << a << " " << b << " " << c;
        }
      }
    }
  }
  EXPECT_TRUE(ranks_before(0.5, 7, 0.5, 1) == false);  // a tie goes to the lower id
  EXPECT_TRUE(ranks_before(-inf, 9, nan, 0));         // any number before NaN
  EXPECT_TRUE(ranks_before(nan, 2, nan, 3));          // NaNs by id
}

TEST(RouteWidth, TopKOrTopPCappedAtTheKeptGroups) {
  RouteRule rule;
  rule.top_k = 8;
  EXPECT_EQ(route_width(rule, 256), 8);
  rule.top_p_mode = true;
  rule.max_k = 40;
  rule.groups = 8;
  rule.groups_kept = 1;
  EXPECT_EQ(route_width(rule, 256), 32);
  rule.groups_kept = 4;
  EXPECT_EQ(route_width(rule, 256), 40);
}

TEST(RouteWeight, RenormalisesScalesAndSurvivesAZeroSum) {
  EXPECT_EQ(detail::route_weight(0.25, 0.5, true, 2.5), 1.25f);
  EXPECT_EQ(detail::route_weight(0.0, 0.0, true, 2.5), 0.0f);  // every chosen sigmoid underflowed: 0, not NaN
  EXPECT_EQ(detail::route_weight(0.25, 0.5, false, 2.5), 0.625f);
  EXPECT_TRUE(std::isnan(detail::route_weight(0.25, std::nan(""), true, 1.0)));
}

}  // namespace
}  // namespace moed::kernels
