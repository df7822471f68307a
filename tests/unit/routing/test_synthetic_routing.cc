// Synthetic routing traces: a pure function of (spec, token index), the
// shape of every cell, the calibrated load skew, topic persistence across
// layers (next-layer affinity) and seeds; per-layer expert loads (a text
// domain's) followed, with the same co-routed groups for the same seed.
#include "routing/synthetic_routing.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <set>
#include <vector>

#include "common/error.h"
#include "common/rng.h"
#include "routing/routing_trace.h"
#include "tests/unit/test_support.h"

namespace moed::routing {
namespace {

SyntheticRoutingSpec spec_of(int layers, int experts, int top_k) {
  SyntheticRoutingSpec s;
  s.layers = layers;
  s.experts = experts;
  s.top_k = top_k;
  return s;
}

void expect_same_tokens(const RoutingTrace& a, std::size_t a_first, const RoutingTrace& b,
                        std::size_t b_first, std::size_t count) {
  ASSERT_EQ(a.layers(), b.layers());
  for (std::size_t i = 0; i < count; ++i)
    for (int l = 0; l < a.layers(); ++l) {
      auto x = a.at(a_first + i, l), y = b.at(b_first + i, l);
      EXPECT_TRUE(std::equal(x.begin(), x.end(), y.begin(), y.end()))
          << "token " << a_first + i << " layer " << l;
    }
}

TEST(SyntheticRouting, TokenIsAPureFunctionOfSpecAndIndex) {
  const SyntheticRoutingSpec spec = spec_of(3, 16, 2);
  RoutingTrace whole = synthetic_routing(spec, 0, 30);
  RoutingTrace part = synthetic_routing(spec, 10, 10);
  ASSERT_EQ(whole.tokens(), 30u);
  ASSERT_EQ(part.tokens(), 10u);
  expect_same_tokens(part, 0, whole, 10, 10);
  // And the same call twice gives the same trace.
  expect_same_tokens(synthetic_routing(spec, 10, 10), 0, part, 0, 10);
}

struct ShapeCase {
  int layers, experts, top_k;
};
class SyntheticShape : public testing::TestWithParam<ShapeCase> {};

TEST_P(SyntheticShape, CellsHoldTopKDistinctExpertsWithFallingWeights) {
  const ShapeCase c = GetParam();
  RoutingTrace t = synthetic_routing(spec_of(c.layers, c.experts, c.top_k), 0, 300);
  ASSERT_EQ(t.layers(), c.layers);
  ASSERT_EQ(t.experts(), c.experts);
  ASSERT_EQ(t.tokens(), 300u);
  EXPECT_EQ(t.top_k(), c.top_k);
  for (std::size_t i = 0; i < t.tokens(); ++i)
    for (int l = 0; l < c.layers; ++l) {
      auto cell = t.at(i, l);
      ASSERT_EQ(int(cell.size()), c.top_k) << "token " << i << " layer " << l;
      std::set<std::uint32_t> distinct;
      double sum = 0;
      for (std::size_t j = 0; j < cell.size(); ++j) {
        EXPECT_LT(int(cell[j].expert), c.experts);
        distinct.insert(cell[j].expert);
        sum += cell[j].weight;
        if (j > 0) {
          EXPECT_LT(cell[j].weight, cell[j - 1].weight) << "token " << i << " layer " << l;
        }
      }
      EXPECT_EQ(int(distinct.size()), c.top_k) << "token " << i << " layer " << l;
      EXPECT_NEAR(sum, 1.0, 1e-6);
    }
}
INSTANTIATE_TEST_SUITE_P(Shapes, SyntheticShape,
                         testing::Values(ShapeCase{1, 8, 2}, ShapeCase{4, 32, 4}, ShapeCase{2, 20, 3},
                                         ShapeCase{2, 6, 1}));

struct HotCase {
  int experts, top_k;
  double hot_ratio;
};
class SyntheticHotRatio : public testing::TestWithParam<HotCase> {};

TEST_P(SyntheticHotRatio, HottestExpertMatchesSpecInEveryLayer) {
  const HotCase c = GetParam();
  SyntheticRoutingSpec spec = spec_of(3, c.experts, c.top_k);
  spec.hot_ratio = c.hot_ratio;
  const std::size_t T = 20000;
  RoutingTrace t = synthetic_routing(spec, 0, T);
  const double mean = double(T) * c.top_k / c.experts;
  for (int l = 0; l < spec.layers; ++l) {
    std::vector<double> load(c.experts, 0.0);
    for (std::size_t i = 0; i < T; ++i)
      for (const RoutingChoice& ch : t.at(i, l)) load[ch.expert] += 1;
    double ratio = *std::max_element(load.begin(), load.end()) / mean;
    EXPECT_NEAR(ratio, c.hot_ratio, 0.15) << "layer " << l;
  }
}
INSTANTIATE_TEST_SUITE_P(Skews, SyntheticHotRatio,
                         testing::Values(HotCase{32, 4, 2.75}, HotCase{16, 2, 2.0}, HotCase{24, 3, 3.5}));

// Share of the top next-layer expert in each expert's next-layer routing,
// summed over experts: sum_a max_b A(a, b) / sum_a sum_b A(a, b), with A the
// layer l -> l + 1 affinity counts.
double affinity_concentration(const RoutingTrace& t, int layer) {
  const int E = t.experts();
  std::vector<std::vector<double>> a(E, std::vector<double>(E, 0.0));
  for (std::size_t i = 0; i < t.tokens(); ++i)
    for (const RoutingChoice& x : t.at(i, layer))
      for (const RoutingChoice& y : t.at(i, layer + 1)) a[x.expert][y.expert] += 1;
  double top = 0, all = 0;
  for (const auto& row : a) {
    top += *std::max_element(row.begin(), row.end());
    for (double v : row) all += v;
  }
  return top / all;
}

TEST(SyntheticRouting, TopicPersistenceGivesNextLayerAffinity) {
  // Persistence 1: a token keeps its topic, so an expert's tokens go on to the
  // few experts of that topic in the next layer. Persistence 0: the next
  // topic is drawn afresh, and the next layer looks like the overall loads.
  // (Measured: about 0.18 against 0.09.)
  SyntheticRoutingSpec spec = spec_of(3, 32, 4);
  spec.topic_persistence = 1.0;
  RoutingTrace kept = synthetic_routing(spec, 0, 4000);
  spec.topic_persistence = 0.0;
  RoutingTrace fresh = synthetic_routing(spec, 0, 4000);
  for (int l = 0; l + 1 < spec.layers; ++l) {
    double with = affinity_concentration(kept, l), without = affinity_concentration(fresh, l);
    EXPECT_GT(with, 1.5 * without) << "layer " << l << ": persistence 1 " << with << ", 0 " << without;
  }
}

TEST(SyntheticRouting, DifferentSeedsGiveDifferentTraces) {
  SyntheticRoutingSpec spec = spec_of(2, 16, 2);
  RoutingTrace a = synthetic_routing(spec, 0, 50);
  spec.seed = 2;
  RoutingTrace b = synthetic_routing(spec, 0, 50);
  std::size_t differing = 0;
  for (std::size_t i = 0; i < 50; ++i)
    for (int l = 0; l < 2; ++l) {
      auto x = a.at(i, l), y = b.at(i, l);
      differing += !std::equal(x.begin(), x.end(), y.begin(), y.end());
    }
  EXPECT_GT(differing, 50u);  // of 100 cells
}

TEST(SyntheticRouting, UnreachableHotRatioIsUsageError) {
  // 8 experts, top-2: every token holds the hottest at most once, so its load
  // is at most 8 / 2 = 4 times the mean.
  SyntheticRoutingSpec spec = spec_of(1, 8, 2);
  spec.hot_ratio = 5.0;
  test::expect_error([&] { synthetic_routing(spec, 0, 10); }, ErrorKind::Usage, {"hot_ratio", "out of reach"});
}

// Each expert's share of a layer's routed pairs.
std::vector<double> load_shares(const RoutingTrace& t, int layer) {
  std::vector<double> load(t.experts(), 0.0);
  double all = 0;
  for (std::size_t i = 0; i < t.tokens(); ++i)
    for (const RoutingChoice& ch : t.at(i, layer)) load[ch.expert] += 1, all += 1;
  for (double& x : load) x /= all;
  return load;
}

// Loads shaped like OLMoE's measured ones (64 experts, top-8): a few hot
// experts up to 3-7x the mean, one never chosen, and a long flat tail.
std::vector<double> domain_loads(std::uint64_t seed) {
  std::vector<double> loads(64);
  for (int e = 0; e < 64; ++e) loads[e] = 1 + double(hash_combine(seed, e) % 100) / 100.0;
  loads[seed % 64] = 7, loads[(seed * 7 + 3) % 64] = 4, loads[(seed * 13 + 5) % 64] = 3;
  loads[(seed * 5 + 1) % 64] = 0;
  return loads;
}

TEST(SyntheticRoutingLoads, EachLayerFollowsItsGivenLoads) {
  SyntheticRoutingSpec spec = spec_of(2, 64, 8);
  spec.expert_loads = {domain_loads(1), domain_loads(2)};
  const RoutingTrace t = synthetic_routing(spec, 0, 20000);
  for (int l = 0; l < 2; ++l) {
    const std::vector<double>& want = spec.expert_loads[std::size_t(l)];
    double total = 0;
    for (double x : want) total += x;
    const std::vector<double> got = load_shares(t, l);
    for (int e = 0; e < 64; ++e)
      EXPECT_NEAR(got[std::size_t(e)], want[std::size_t(e)] / total, 0.2 * want[std::size_t(e)] / total + 1e-3)
          << "layer " << l << " expert " << e;
  }
}

TEST(SyntheticRoutingLoads, TheSameSeedKeepsTheGroupsWhateverTheLoads) {
  // Two "domains": the same seed and different loads route with the same
  // topics, so the 100 pairs routed together most often for their loads
  // (the highest lift: pair count over the product of the two loads) share
  // many more pairs than with another seed (measured: 19 against 2).
  SyntheticRoutingSpec a = spec_of(1, 64, 8), b = a, other_seed = a;
  a.expert_loads = {domain_loads(1)};
  b.expert_loads = {domain_loads(2)};
  other_seed.expert_loads = b.expert_loads;
  other_seed.seed = 9;
  auto top_pairs = [](const RoutingTrace& t) {
    std::map<std::pair<int, int>, double> pairs;
    const std::vector<double> load = load_shares(t, 0);
    for (std::size_t i = 0; i < t.tokens(); ++i) {
      auto cell = t.at(i, 0);
      for (std::size_t x = 0; x < cell.size(); ++x)
        for (std::size_t y = x + 1; y < cell.size(); ++y)
          pairs[std::minmax(int(cell[x].expert), int(cell[y].expert))] += 1;
    }
    std::vector<std::pair<double, std::pair<int, int>>> ranked;
    for (const auto& [p, n] : pairs)
      ranked.emplace_back(-n / (load[std::size_t(p.first)] * load[std::size_t(p.second)]), p);
    std::sort(ranked.begin(), ranked.end());
    std::set<std::pair<int, int>> top;
    for (std::size_t i = 0; i < 100 && i < ranked.size(); ++i) top.insert(ranked[i].second);
    return top;
  };
  const auto ta = top_pairs(synthetic_routing(a, 0, 5000)), tb = top_pairs(synthetic_routing(b, 0, 5000)),
             tc = top_pairs(synthetic_routing(other_seed, 0, 5000));
  auto shared = [](const auto& x, const auto& y) {
    return std::count_if(x.begin(), x.end(), [&](const auto& p) { return y.count(p) > 0; });
  };
  EXPECT_GT(shared(ta, tb), 2 * shared(tb, tc)) << "same seed " << shared(ta, tb) << ", other seed " << shared(tb, tc);
}

TEST(SyntheticRoutingLoads, BadLoadsAreUsageErrors) {
  SyntheticRoutingSpec spec = spec_of(2, 8, 2);
  spec.expert_loads = {std::vector<double>(8, 1.0)};
  test::expect_error([&] { synthetic_routing(spec, 0, 10); }, ErrorKind::Usage, {"1 layers", "has 2"});
  spec.expert_loads = {std::vector<double>(8, 1.0), std::vector<double>(7, 1.0)};
  test::expect_error([&] { synthetic_routing(spec, 0, 10); }, ErrorKind::Usage, {"7 values for 8 experts"});
  spec.expert_loads[1] = std::vector<double>(8, 0.0);
  test::expect_error([&] { synthetic_routing(spec, 0, 10); }, ErrorKind::Usage, {"all 8 are 0"});
  spec.expert_loads[1][3] = -1;
  test::expect_error([&] { synthetic_routing(spec, 0, 10); }, ErrorKind::Usage, {"-1 is not a load"});
}

// DeepSeek-V3's shape: 256 experts in 8 groups of 32, top-8 within at most 4
// groups; without the limit, tokens touch most of the 8 groups.
TEST(SyntheticRoutingGroups, EveryTokenStaysWithinItsKeptGroups) {
  SyntheticRoutingSpec spec = spec_of(3, 256, 8);
  spec.groups = 8;
  spec.groups_kept = 4;
  const RoutingTrace limited = synthetic_routing(spec, 0, 2000);
  spec.groups = spec.groups_kept = 0;
  const RoutingTrace free = synthetic_routing(spec, 0, 2000);
  std::size_t over_limit_free = 0;
  for (std::size_t t = 0; t < limited.tokens(); ++t)
    for (int l = 0; l < 3; ++l) {
      std::set<int> groups, free_groups;
      for (const RoutingChoice& c : limited.at(t, l)) groups.insert(int(c.expert) / 32);
      for (const RoutingChoice& c : free.at(t, l)) free_groups.insert(int(c.expert) / 32);
      ASSERT_EQ(limited.at(t, l).size(), 8u);
      ASSERT_LE(groups.size(), 4u) << "token " << t << " layer " << l;
      // The limit starts from the best choice, and leaves the token's other draws alone.
      EXPECT_EQ(limited.at(t, l)[0].expert, free.at(t, l)[0].expert) << "token " << t << " layer " << l;
      over_limit_free += free_groups.size() > 4;
    }
  EXPECT_GT(over_limit_free, 1000u) << "the free routing should often touch more than 4 groups";
}

TEST(SyntheticRoutingGroups, GroupsThatCannotHoldTheChoicesAreUsageErrors) {
  SyntheticRoutingSpec spec = spec_of(1, 16, 4);
  spec.groups = 3;
  spec.groups_kept = 1;
  test::expect_error([&] { synthetic_routing(spec, 0, 1); }, ErrorKind::Usage, {"3 expert groups", "16 experts"});
  spec.groups = 8;  // groups of 2: one group cannot hold top-4
  test::expect_error([&] { synthetic_routing(spec, 0, 1); }, ErrorKind::Usage, {"1 kept groups of 2", "top-4"});
  spec.groups_kept = 9;
  test::expect_error([&] { synthetic_routing(spec, 0, 1); }, ErrorKind::Usage, {"9 kept groups"});
}

}  // namespace
}  // namespace moed::routing
