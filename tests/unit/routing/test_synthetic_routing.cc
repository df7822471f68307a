// Synthetic routing traces: a pure function of (spec, token index), the
// shape of every cell, the calibrated load skew, topic persistence across
// layers (next-layer affinity) and seeds.
#include "routing/synthetic_routing.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <set>
#include <vector>

#include "common/error.h"
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

}  // namespace
}  // namespace moed::routing
