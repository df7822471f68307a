// metis's pooled share, chosen by k-fold cross-validation on the
// statistics' sample (choose_pooled_share): each trial is measured on the
// blocks it was not fitted on, the choice is the front's best under the load
// cap, the cap moves it the way it says, and a fixed share is taken as given.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>

#include "common/error.h"
#include "placement/cost_model.h"
#include "placement/optimizer.h"
#include "routing/routing_stats.h"
#include "routing/routing_trace.h"
#include "routing/synthetic_routing.h"
#include "tests/unit/test_support.h"

namespace moed::placement {
namespace {

using routing::RoutingStats;
using routing::RoutingTrace;

// Synthetic routing with enough tokens to judge on (12 layers x 16 experts,
// top-2: 2,000 tokens give 62 per expert of a layer in each block).
const RoutingTrace& routing_trace() {
  static const RoutingTrace t = [] {
    routing::SyntheticRoutingSpec spec;
    spec.layers = 12;
    spec.experts = 16;
    spec.top_k = 2;
    spec.seed = 5;
    return routing::synthetic_routing(spec, 0, 2000);
  }();
  return t;
}
const RoutingStats& routing_stats() {
  static const RoutingStats s = RoutingStats::from_trace(routing_trace(), 0, routing_trace().tokens());
  return s;
}
// 2 islands x 2 ranks, 20 slots per layer.
const Topology kTopology = Topology::blocks(4, 2);
OptimizeOptions budget(double load_cap = 0.02) {
  OptimizeOptions o;
  o.redundant_slots = 4;
  o.load_cap = load_cap;
  return o;
}

TEST(PoolingChoice, EachTrialIsJudgedOnTheBlocksItWasNotFittedOn) {
  const PoolingChoice choice = choose_pooled_share(routing_stats(), kTopology, budget());
  ASSERT_EQ(choice.front.size(), kPooledShares.size());
  // 12 layers are judged on 8 of them: the sample on those alone.
  const std::vector<int> layers = pooling_layers(12);
  EXPECT_EQ(layers, (std::vector<int>{0, 2, 3, 5, 6, 8, 9, 11}));
  EXPECT_EQ(choice.layers, 8);
  const RoutingTrace all = routing_stats().sample_trace();
  RoutingTrace sample(8, all.experts());
  for (std::size_t t = 0; t < all.tokens(); ++t) {
    std::vector<std::vector<routing::RoutingChoice>> path;
    for (int l : layers) path.emplace_back(all.at(t, l).begin(), all.at(t, l).end());
    sample.add_token(path);
  }
  const std::size_t block = sample.tokens() / kPoolingFolds, first = sample.tokens() % kPoolingFolds;
  EXPECT_EQ(choice.tokens, kPoolingFolds * block);
  // The trial at share 1 and greedy-load's load, by hand: each block judged
  // by a placement fitted on the other blocks.
  OptimizeOptions metis = budget(), greedy = budget();
  metis.pooled_share = 1;
  greedy.policy = OptimizerPolicy::greedy_load;
  double copies = 0, load = 0, balanced = 0, balanced_copies = 0;
  for (std::size_t k = 0; k < kPoolingFolds; ++k) {
    const std::size_t judged = first + k * block;
    RoutingTrace rest(sample.layers(), sample.experts());
    rest.append(sample, first, judged);
    rest.append(sample, judged + block, sample.tokens());
    const RoutingStats fit = RoutingStats::from_trace(rest, 0, rest.tokens());
    const Cost c = evaluate(sample, judged, block, optimize(fit, kTopology, metis), kTopology);
    copies += c.cross_island_copies_per_token / kPoolingFolds;
    load += c.max_mean_rank_load / kPoolingFolds;
    const Cost g = evaluate(sample, judged, block, optimize(fit, kTopology, greedy), kTopology);
    balanced += g.max_mean_rank_load / kPoolingFolds;
    balanced_copies += g.cross_island_copies_per_token / kPoolingFolds;
  }
  const PoolingTrial& t = choice.front.back();
  EXPECT_EQ(t.share, 1.0);
  EXPECT_DOUBLE_EQ(t.cross_island_copies_per_token, copies);
  EXPECT_DOUBLE_EQ(t.max_mean_rank_load, load);
  EXPECT_DOUBLE_EQ(choice.balanced_load, balanced);
  EXPECT_DOUBLE_EQ(choice.balanced_copies, balanced_copies);
}

TEST(PoolingChoice, TheLayersJudgedSpreadOverTheModel) {
  EXPECT_EQ(pooling_layers(1), (std::vector<int>{0}));
  EXPECT_EQ(pooling_layers(3), (std::vector<int>{0, 1, 2}));
  EXPECT_EQ(pooling_layers(8), (std::vector<int>{0, 1, 2, 3, 4, 5, 6, 7}));
  EXPECT_EQ(pooling_layers(32), (std::vector<int>{2, 6, 10, 14, 18, 22, 26, 30}));
  EXPECT_EQ(pooling_layers(58), (std::vector<int>{3, 10, 18, 25, 32, 39, 47, 54}));
}

class PoolingCap : public testing::TestWithParam<double> {};

TEST_P(PoolingCap, TheChoiceIsTheFewestCopiesWithinTheCap) {
  const double cap = GetParam();
  const PoolingChoice choice = choose_pooled_share(routing_stats(), kTopology, budget(cap));
  EXPECT_EQ(choice.load_cap, cap);
  const PoolingTrial* best = nullptr;
  for (const PoolingTrial& t : choice.front) {
    EXPECT_EQ(t.within_cap, t.max_mean_rank_load <= choice.balanced_load + cap) << "share " << t.share;
    if (t.within_cap && (!best || t.cross_island_copies_per_token < best->cross_island_copies_per_token)) best = &t;
  }
  // greedy-load is within any cap: it wins when no share is, or when it has fewer copies.
  const bool greedy_wins = !best || choice.balanced_copies < best->cross_island_copies_per_token;
  EXPECT_EQ(choice.load_only, greedy_wins) << choice.describe();
  if (best) {
    EXPECT_EQ(choice.share, best->share) << choice.describe();
  }
}
INSTANTIATE_TEST_SUITE_P(Caps, PoolingCap, testing::Values(0.0, 0.02, 0.1, 1e9));

// What the choice measured for the placement it chose: greedy-load's or a share's.
Cost chosen_cost(const PoolingChoice& c) {
  Cost cost;
  cost.cross_island_copies_per_token = c.balanced_copies, cost.max_mean_rank_load = c.balanced_load;
  if (c.load_only) return cost;
  for (const PoolingTrial& t : c.front)
    if (t.share == c.share)
      cost.cross_island_copies_per_token = t.cross_island_copies_per_token, cost.max_mean_rank_load = t.max_mean_rank_load;
  return cost;
}

TEST(PoolingChoice, ALooserCapTradesLoadForFewerCopies) {
  // One slot per expert: here metis's locality costs load, so the cap binds.
  OptimizeOptions o = budget(0);
  o.redundant_slots = 0;
  const PoolingChoice tight = choose_pooled_share(routing_stats(), kTopology, o);
  o.load_cap = 1e9;
  const PoolingChoice loose = choose_pooled_share(routing_stats(), kTopology, o);
  EXPECT_LE(chosen_cost(tight).max_mean_rank_load, tight.balanced_load) << tight.describe();
  EXPECT_LE(chosen_cost(loose).cross_island_copies_per_token, chosen_cost(tight).cross_island_copies_per_token);
  EXPECT_LE(chosen_cost(tight).max_mean_rank_load, chosen_cost(loose).max_mean_rank_load);
  EXPECT_LT(chosen_cost(loose).cross_island_copies_per_token, chosen_cost(tight).cross_island_copies_per_token);
  EXPECT_TRUE(tight.load_only != loose.load_only || tight.share != loose.share)
      << "the cap changed nothing: " << tight.describe();
}

class PoolingPlacement : public testing::TestWithParam<double> {};

TEST_P(PoolingPlacement, TheOptimiserPlacesWhatItChose) {
  const Optimized chosen = optimize_explained(routing_stats(), kTopology, budget(GetParam()));
  ASSERT_TRUE(chosen.pooling.has_value());
  OptimizeOptions fixed = budget(GetParam());
  fixed.pooled_share = chosen.pooling->share;
  if (chosen.pooling->load_only) fixed.policy = OptimizerPolicy::greedy_load;
  const Optimized again = optimize_explained(routing_stats(), kTopology, fixed);
  EXPECT_FALSE(again.pooling.has_value()) << "a fixed share is taken as given";
  EXPECT_TRUE(again.placement == chosen.placement) << chosen.pooling->describe();
}
INSTANTIATE_TEST_SUITE_P(Caps, PoolingPlacement, testing::Values(0.0, 0.02, 1e9));

TEST(PoolingChoice, GreedyLoadWinsWhereNoShareMeetsTheCap) {
  // One slot per expert and a cap of 0: every share of metis loads the
  // ranks more than greedy-load.
  OptimizeOptions o = budget(0);
  o.redundant_slots = 0;
  const Optimized chosen = optimize_explained(routing_stats(), kTopology, o);
  ASSERT_TRUE(chosen.pooling.has_value());
  EXPECT_TRUE(chosen.pooling->load_only) << chosen.pooling->describe();
  EXPECT_NE(chosen.pooling->describe().find("greedy-load's placement"), std::string::npos);
  o.policy = OptimizerPolicy::greedy_load;
  EXPECT_TRUE(chosen.placement == optimize(routing_stats(), kTopology, o));
}

TEST(PoolingChoice, TheShareIsARealKnob) {
  OptimizeOptions fixed = budget();
  fixed.pooled_share = 0;
  const Placement none = optimize(routing_stats(), kTopology, fixed);
  fixed.pooled_share = 1;
  EXPECT_FALSE(none == optimize(routing_stats(), kTopology, fixed));
}

TEST(PoolingChoice, TooFewSampledTokensChooseNothing) {
  // 4 blocks of 32 tokens per expert of a layer: 16 experts at top-2 take 1,024.
  const RoutingStats few = RoutingStats::from_trace(routing_trace(), 0, 1023);
  const PoolingChoice choice = choose_pooled_share(few, kTopology, budget());
  EXPECT_EQ(choice.tokens, 0u);
  EXPECT_EQ(choice.tokens_needed, 1024u);
  EXPECT_EQ(choice.share, 0.5);
  EXPECT_TRUE(choice.front.empty());
  EXPECT_NE(choice.describe().find("too few sampled tokens to choose it (1024 are needed"), std::string::npos)
      << choice.describe();
  EXPECT_EQ(choose_pooled_share(RoutingStats::from_trace(routing_trace(), 0, 1024), kTopology, budget()).tokens, 1024u);
  // The real Mixtral trace (338 tokens, 8 experts, top-2) is too short to judge.
  const RoutingTrace mixtral = routing::read_trace(std::string(MOED_TEST_DATA_DIR) + "/mixtral-humaneval.trace");
  const PoolingChoice short_trace =
      choose_pooled_share(RoutingStats::from_trace(mixtral, 0, mixtral.tokens()), kTopology, budget());
  EXPECT_EQ(short_trace.tokens, 0u);
  EXPECT_EQ(short_trace.tokens_needed, 512u);
}

TEST(PoolingChoiceErrors, ShareAndCapOutOfRangeAreUsageErrors) {
  OptimizeOptions o = budget();
  o.pooled_share = 1.5;
  test::expect_error([&] { optimize(routing_stats(), kTopology, o); }, ErrorKind::Usage, {"pooled share 1.5"});
  o.pooled_share = std::numeric_limits<double>::quiet_NaN();
  test::expect_error([&] { optimize(routing_stats(), kTopology, o); }, ErrorKind::Usage, {"pooled share"});
  o = budget(-0.1);
  test::expect_error([&] { optimize(routing_stats(), kTopology, o); }, ErrorKind::Usage, {"load cap -0.1"});
}

}  // namespace
}  // namespace moed::placement
