// Statistics from tokens whose layers arrive in separate steps: choices at
// once, transitions when the previous layer was seen, whole paths into the
// sample, in bounded memory.
#include "routing/token_paths.h"

#include <gtest/gtest.h>

#include <vector>

namespace moed::routing {
namespace {

std::vector<std::uint32_t> e(std::initializer_list<std::uint32_t> x) { return x; }

TEST(TokenPaths, FeedsChoicesTransitionsAndWholePaths) {
  RoutingStats stats(3, 4, 0, 16, 2);
  TokenPaths paths(3, 2, 8);
  // Two tokens interleaved, as two micro-batches would arrive.
  paths.observe(7, 0, 0, e({0, 1}), stats);
  paths.observe(7, 1, 0, e({2, 3}), stats);
  paths.observe(7, 0, 1, e({1, 2}), stats);
  paths.observe(7, 1, 1, e({3}), stats);
  paths.observe(7, 0, 2, e({0}), stats);
  EXPECT_DOUBLE_EQ(stats.load(0, 0), 1);
  EXPECT_DOUBLE_EQ(stats.coactivation(0, 2, 3), 1);
  EXPECT_DOUBLE_EQ(stats.affinity(0, 0, 1), 1);  // token (7, 0): 0 -> 1 and 2
  EXPECT_DOUBLE_EQ(stats.affinity(0, 0, 2), 1);
  EXPECT_DOUBLE_EQ(stats.affinity(0, 3, 3), 1);  // token (7, 1)
  EXPECT_DOUBLE_EQ(stats.affinity(1, 2, 0), 1);
  EXPECT_EQ(stats.sample_size(), 1u);  // only (7, 0) has passed every layer
  EXPECT_EQ(paths.followed(), 2u);
}

TEST(TokenPaths, AGapMeansNoTransitionAndNoPath) {
  RoutingStats stats(3, 4, 0, 16, 2);
  TokenPaths paths(3, 2, 8);
  paths.observe(1, 0, 0, e({0}), stats);
  paths.observe(1, 0, 2, e({1}), stats);  // layer 1 never came
  EXPECT_DOUBLE_EQ(stats.affinity(1, 0, 1), 0);
  EXPECT_EQ(stats.sample_size(), 0u);
  EXPECT_DOUBLE_EQ(stats.load(2, 1), 1);  // the choice still counts
}

TEST(TokenPaths, TheOldestTokenIsForgottenFirst) {
  RoutingStats stats(2, 4, 0, 16, 2);
  TokenPaths paths(2, 2, 2);
  paths.observe(1, 0, 0, e({0}), stats);
  paths.observe(2, 0, 0, e({1}), stats);
  paths.observe(3, 0, 0, e({2}), stats);  // evicts request 1
  EXPECT_EQ(paths.followed(), 2u);
  paths.observe(1, 0, 1, e({3}), stats);  // request 1 is new again: no transition
  paths.observe(3, 0, 1, e({3}), stats);
  EXPECT_DOUBLE_EQ(stats.affinity(0, 0, 3), 0);
  EXPECT_DOUBLE_EQ(stats.affinity(0, 2, 3), 1);
}

}  // namespace
}  // namespace moed::routing
