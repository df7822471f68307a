// The lower bound on the pairs any re-routing must move to bring the loads'
// std/mean to a target (runtime/router/policies/spread_bound.h): by hand on
// small cases, the clipped loads are never beaten by random re-routings of
// the same number of moves, and the split over cells is the cheapest one a
// brute-force search over the split finds.
#include "runtime/router/policies/spread_bound.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "common/rng.h"
#include "common/summary_stats.h"
#include "tests/unit/test_support.h"

namespace moed::runtime {
namespace {

double half_l1(const std::vector<double>& a, const std::vector<double>& b) {
  double s = 0;
  for (std::size_t i = 0; i < a.size(); ++i) s += std::abs(a[i] - b[i]);
  return s / 2;
}

std::vector<double> skewed_loads(std::size_t experts, std::uint64_t seed) {
  const CounterRng rng(seed);
  std::vector<double> v(experts);
  for (std::size_t e = 0; e < experts; ++e) v[e] = std::round(100 * std::exp(rng.normalish(e)));
  v[0] *= 3;  // a hot expert
  return v;
}

// The fewest moves that bring one cell to `target`, by bisection on flattest_loads.
double cell_moves(const std::vector<double>& load, double target) {
  double lo = 0, hi = std::accumulate(load.begin(), load.end(), 0.0);
  if (std_over_mean(load) <= target) return 0;
  for (int i = 0; i < 100; ++i) {
    const double mid = (lo + hi) / 2;
    (std_over_mean(flattest_loads(load, mid)) > target ? lo : hi) = mid;
  }
  return hi;
}

TEST(SpreadBound, TwoExpertsByHand) {
  // {3, 1}: mean 2, std 1. Spread 0.1 needs {2.2, 1.8}: 0.8 of the 4 pairs move.
  const std::vector<std::vector<double>> cells{{3, 1}};
  const SpreadBound b = min_moves_for_spread(cells, 0.1);
  EXPECT_NEAR(b.moves, 0.8, 1e-9);
  EXPECT_EQ(b.pairs, 4);
  EXPECT_NEAR(b.share(), 0.2, 1e-9);
  EXPECT_NEAR(min_moves_for_spread(cells, 0).moves, 1.0, 1e-9);
}

TEST(SpreadBound, AHotExpertByHand) {
  // {5, 1, 1, 1}: flat is {2, 2, 2, 2}, 3 moves; halfway (1.5 moves) is {3.5, 1.5, 1.5, 1.5}.
  const std::vector<std::vector<double>> cells{{5, 1, 1, 1}};
  EXPECT_NEAR(min_moves_for_spread(cells, 0).moves, 3.0, 1e-9);
  const std::vector<double> half = flattest_loads(cells[0], 1.5);
  EXPECT_NEAR(half[0], 3.5, 1e-12);
  for (int e = 1; e < 4; ++e) EXPECT_NEAR(half[std::size_t(e)], 1.5, 1e-12);
  EXPECT_NEAR(min_moves_for_spread(cells, std_over_mean(half)).moves, 1.5, 1e-9);
}

TEST(SpreadBound, NothingMovesWhereTheSpreadIsAlreadyUnderTheTarget) {
  const std::vector<std::vector<double>> cells{{10, 10, 11, 9}, {}, {0, 0, 0}};
  const SpreadBound b = min_moves_for_spread(cells, 0.1);
  EXPECT_EQ(b.moves, 0);
  EXPECT_EQ(b.pairs, 40);
}

// levels_for_spread: the window the fewest moves clip to. {5, 1, 1, 1} to
// std/mean 0.5 (std 1 at mean 2): by hand, {3.5, 1.5, 1.5, 1.5} has std
// 0.866, so the top is lower: top t, floor f with 5 - t = 3 (f - 1) and
// mean 2; std 1 gives t = 2 + sqrt(3), f = 2 - 1 / sqrt(3).
TEST(SpreadBound, LevelsForSpreadByHand) {
  const std::vector<double> load{5, 1, 1, 1};
  const SpreadLevels at = levels_for_spread(load, 0.5);
  EXPECT_NEAR(at.top, 2 + std::sqrt(3.0), 1e-9);
  EXPECT_NEAR(at.floor, 2 - 1 / std::sqrt(3.0), 1e-9);
  const SpreadLevels within = levels_for_spread(std::vector<double>{10, 11, 9}, 0.5);
  EXPECT_EQ(within.floor, 9);
  EXPECT_EQ(within.top, 11);
  const SpreadLevels none = levels_for_spread(std::vector<double>{}, 0.1);
  EXPECT_EQ(none.floor, 0);
  EXPECT_EQ(none.top, 0);
  test::expect_error([&] { levels_for_spread(load, -1); }, ErrorKind::Internal, {"target -1"});
}

TEST(SpreadBound, RefusesBadInput) {
  const std::vector<std::vector<double>> bad{{1, -2}};
  test::expect_error([&] { min_moves_for_spread(bad, 0.1); }, ErrorKind::Internal, {"load -2"});
  const std::vector<std::vector<double>> good{{1, 2}};
  test::expect_error([&] { min_moves_for_spread(good, -1); }, ErrorKind::Internal, {"target -1"});
}

class SpreadBoundRandom : public ::testing::TestWithParam<std::uint64_t> {};

// Clipping a cell to its levels reaches the target, and what it takes off
// the top is the bound's moves for that cell.
TEST_P(SpreadBoundRandom, ClippingToTheLevelsReachesTheTargetWithTheBoundsMoves) {
  const std::vector<double> load = skewed_loads(16, GetParam());
  for (double target : {0.05, 0.1, 0.3}) {
    SCOPED_TRACE(testing::Message() << "target " << target);
    const SpreadLevels at = levels_for_spread(load, target);
    std::vector<double> clipped;
    double off_top = 0;
    for (double v : load) clipped.push_back(std::clamp(v, at.floor, at.top)), off_top += std::max(0.0, v - at.top);
    EXPECT_NEAR(std_over_mean(clipped), target, 1e-6);
    EXPECT_NEAR(std::accumulate(clipped.begin(), clipped.end(), 0.0), std::accumulate(load.begin(), load.end(), 0.0),
                1e-6);
    const std::vector<std::vector<double>> cells{load};
    EXPECT_NEAR(off_top, min_moves_for_spread(cells, target).moves, 1e-6 * off_top);
  }
}

TEST_P(SpreadBoundRandom, ClippedLoadsAreNeverBeatenByRandomReRoutings) {
  const std::uint64_t seed = GetParam();
  for (std::size_t E : {4u, 8u, 64u}) {
    const std::vector<double> load = skewed_loads(E, seed * 100 + E);
    const double total = std::accumulate(load.begin(), load.end(), 0.0);
    const CounterRng rng(seed ^ 0xabcdef);
    std::uint64_t draw = 0;
    for (double share : {0.01, 0.05, 0.2}) {
      const double moves = share * total;
      const std::vector<double> flat = flattest_loads(load, moves);
      EXPECT_NEAR(std::accumulate(flat.begin(), flat.end(), 0.0), total, 1e-9 * total);
      EXPECT_LE(half_l1(load, flat), moves * (1 + 1e-9) + 1e-9);
      const double best = std_over_mean(flat);
      // Random re-routings: `moves` units in random lumps from random experts to others.
      for (int trial = 0; trial < 200; ++trial) {
        std::vector<double> t = load;
        double left = moves;
        while (left > 1e-9) {
          const std::size_t from = std::size_t(rng.uniform(draw++) * float(E)) % E;
          const std::size_t to = std::size_t(rng.uniform(draw++) * float(E)) % E;
          const double lump = std::min({left, t[from], double(rng.uniform(draw++)) * moves / 4 + 1e-6});
          if (from == to || lump <= 0) continue;
          t[from] -= lump, t[to] += lump, left -= lump;
        }
        EXPECT_GE(std_over_mean(t), best - 1e-12) << "E " << E << " share " << share << " trial " << trial;
      }
    }
  }
}

TEST_P(SpreadBoundRandom, SplitsTheTargetOverCellsAsCheaplyAsABruteForceSearch) {
  const std::uint64_t seed = GetParam();
  const std::vector<std::vector<double>> cells{skewed_loads(8, seed), skewed_loads(8, seed + 7)};
  const double target = 0.1;
  const SpreadBound b = min_moves_for_spread(cells, target);
  // Every split of the mean target 0.1 between the two cells: g1 + g2 = 0.2.
  double brute = 1e300;
  const double g1_max = std_over_mean(cells[0]);
  for (int i = 0; i <= 2000; ++i) {
    const double g1 = std::min(g1_max, 2 * target) * i / 2000.0, g2 = 2 * target - g1;
    brute = std::min(brute, cell_moves(cells[0], g1) + cell_moves(cells[1], g2));
  }
  EXPECT_LE(b.moves, brute * (1 + 1e-6));     // a lower bound, never above an attainable split
  EXPECT_GE(b.moves, brute * (1 - 1e-3));     // and tight: the grid's split is within its step
  // Identical cells split evenly: the bound is each cell's own.
  const std::vector<std::vector<double>> twins{cells[0], cells[0], cells[0]};
  EXPECT_NEAR(min_moves_for_spread(twins, target).moves, 3 * cell_moves(cells[0], target),
              1e-6 * cell_moves(cells[0], target));
}

INSTANTIATE_TEST_SUITE_P(Seeds, SpreadBoundRandom, ::testing::Values(1u, 2u, 3u, 4u, 5u));

}  // namespace
}  // namespace moed::runtime
