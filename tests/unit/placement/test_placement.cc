// Placements: the built-in policies, replicas, per-rank queries and validate().
#include "placement/placement.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <string>
#include <tuple>
#include <vector>

#include "common/error.h"
#include "tests/unit/test_support.h"

namespace moed::placement {
namespace {

// Rank of the single slot of each expert of `layer`.
std::vector<int> single_ranks(const Placement& p, int layer) {
  std::vector<int> out;
  for (int e = 0; e < p.experts(); ++e) {
    EXPECT_EQ(p.replicas(layer, e).size(), 1u) << "layer " << layer << " expert " << e;
    out.push_back(p.replicas(layer, e).empty() ? -1 : p.replicas(layer, e)[0]);
  }
  return out;
}

std::vector<int> slots_per_rank(const Placement& p, int layer) {
  std::vector<int> n(p.ranks(), 0);
  for (int r = 0; r < p.ranks(); ++r) n[r] = int(p.experts_on(layer, r).size());
  return n;
}

struct PolicyCase {
  int ranks, experts;
  std::vector<int> want;  // rank of each expert
};

void PrintTo(const PolicyCase& c, std::ostream* os) {
  *os << c.experts << " experts on " << c.ranks << " ranks";
}

class Contiguous : public ::testing::TestWithParam<PolicyCase> {};

TEST_P(Contiguous, PutsExpertEOnRankEOverCeilEOverR) {
  const auto& c = GetParam();
  Placement p = contiguous(c.ranks, 3, c.experts);
  EXPECT_EQ(p.ranks(), c.ranks);
  EXPECT_EQ(p.layers(), 3);
  EXPECT_EQ(p.experts(), c.experts);
  EXPECT_EQ(p.epoch(), 0u);
  for (int l = 0; l < 3; ++l) EXPECT_EQ(single_ranks(p, l), c.want) << "layer " << l;
  EXPECT_NO_THROW(p.validate("contiguous"));
}

INSTANTIATE_TEST_SUITE_P(
    HandComputed, Contiguous,
    ::testing::Values(PolicyCase{4, 8, {0, 0, 1, 1, 2, 2, 3, 3}},
                      PolicyCase{3, 8, {0, 0, 0, 1, 1, 1, 2, 2}},
                      PolicyCase{8, 4, {0, 1, 2, 3}},  // more ranks than experts
                      PolicyCase{4, 10, {0, 0, 0, 1, 1, 1, 2, 2, 2, 3}},
                      PolicyCase{1, 3, {0, 0, 0}}));

class RoundRobin : public ::testing::TestWithParam<PolicyCase> {};

TEST_P(RoundRobin, PutsExpertEOnRankEModR) {
  const auto& c = GetParam();
  Placement p = round_robin(c.ranks, 2, c.experts);
  for (int l = 0; l < 2; ++l) EXPECT_EQ(single_ranks(p, l), c.want) << "layer " << l;
}

INSTANTIATE_TEST_SUITE_P(HandComputed, RoundRobin,
                         ::testing::Values(PolicyCase{4, 8, {0, 1, 2, 3, 0, 1, 2, 3}},
                                           PolicyCase{3, 8, {0, 1, 2, 0, 1, 2, 0, 1}},
                                           PolicyCase{8, 4, {0, 1, 2, 3}}));

class Shuffled : public ::testing::TestWithParam<std::pair<int, int>> {};

TEST_P(Shuffled, IsABalancedPermutationPerLayer) {
  const auto [ranks, experts] = GetParam();
  const int layers = 6;
  Placement p = shuffled(ranks, layers, experts, 7);
  Placement base = contiguous(ranks, layers, experts);
  EXPECT_NO_THROW(p.validate("shuffled"));
  for (int l = 0; l < layers; ++l) {
    std::vector<int> r = single_ranks(p, l);
    // Each expert exactly once, and each rank as many as contiguous gives it.
    EXPECT_EQ(slots_per_rank(p, l), slots_per_rank(base, l)) << "layer " << l;
    std::vector<int> sorted = r;
    std::sort(sorted.begin(), sorted.end());
    EXPECT_EQ(sorted, single_ranks(base, l)) << "layer " << l;  // contiguous's list is sorted
  }
  // With E >= 8 two layers drawing the same map is vanishingly unlikely.
  for (int a = 0; a < layers; ++a)
    for (int b = a + 1; b < layers; ++b)
      EXPECT_NE(single_ranks(p, a), single_ranks(p, b)) << "layers " << a << " and " << b;
  EXPECT_NE(p, base);
  EXPECT_EQ(p, shuffled(ranks, layers, experts, 7));  // deterministic per seed
  EXPECT_NE(p, shuffled(ranks, layers, experts, 8));  // and the seed matters
}

INSTANTIATE_TEST_SUITE_P(Shapes, Shuffled,
                         ::testing::Values(std::pair{4, 8}, std::pair{4, 16}, std::pair{3, 10},
                                           std::pair{8, 64}));

TEST(AddRandomReplicas, AddsEachReplicaOnANewRank) {
  // 16 ranks, 8 experts, 3 extra per layer: an expert can never run out of
  // free ranks, so every extra lands and each layer has 8 + 3 slots.
  Placement base = contiguous(16, 4, 8);
  Placement p = add_random_replicas(base, 3, 5);
  EXPECT_NO_THROW(p.validate("replicas"));  // in range, no rank twice
  int total = 0;
  for (int l = 0; l < 4; ++l) {
    int slots = 0;
    for (int e = 0; e < 8; ++e) {
      const auto& r = p.replicas(l, e);
      ASSERT_FALSE(r.empty());
      EXPECT_EQ(r[0], base.replicas(l, e)[0]) << "the original slot stays first";
      slots += int(r.size());
    }
    EXPECT_EQ(slots, 8 + 3) << "layer " << l;
    total += slots;
  }
  int on_ranks = 0;
  for (int r = 0; r < 16; ++r) on_ranks += p.slots_on(r);
  EXPECT_EQ(on_ranks, total);
  EXPECT_EQ(p, add_random_replicas(base, 3, 5));
  EXPECT_NE(p, add_random_replicas(base, 3, 6));
}

TEST(AddRandomReplicas, StopsWhenAnExpertIsEverywhere) {
  // 2 ranks: an expert takes at most one extra replica; 20 tries must terminate.
  Placement p = add_random_replicas(contiguous(2, 2, 2), 20, 1);
  EXPECT_NO_THROW(p.validate("replicas"));
  for (int l = 0; l < 2; ++l)
    for (int e = 0; e < 2; ++e) EXPECT_LE(p.replicas(l, e).size(), 2u);
  // One rank: nothing to add.
  EXPECT_EQ(add_random_replicas(contiguous(1, 2, 4), 5, 1), contiguous(1, 2, 4));
}

// 3 ranks, 2 layers, 4 experts, placed by hand.
Placement hand_placement() {
  Placement p(3, 2, 4);
  p.set_replicas(0, 0, {0});
  p.set_replicas(0, 1, {1, 0});
  p.set_replicas(0, 2, {2});
  p.set_replicas(0, 3, {2, 1, 0});
  p.set_replicas(1, 0, {1});
  p.set_replicas(1, 1, {1});
  p.set_replicas(1, 2, {1});
  p.set_replicas(1, 3, {0});
  return p;
}

TEST(Placement, PerRankQueries) {
  Placement p = hand_placement();
  EXPECT_EQ(p.replicas(0, 3), (std::vector<int>{2, 1, 0}));  // replica order kept
  EXPECT_EQ(p.experts_on(0, 0), (std::vector<int>{0, 1, 3}));
  EXPECT_EQ(p.experts_on(0, 1), (std::vector<int>{1, 3}));
  EXPECT_EQ(p.experts_on(0, 2), (std::vector<int>{2, 3}));
  EXPECT_EQ(p.experts_on(1, 1), (std::vector<int>{0, 1, 2}));
  EXPECT_EQ(p.experts_on(1, 2), (std::vector<int>{}));
  EXPECT_EQ(p.slots_on(0), 3 + 1);
  EXPECT_EQ(p.slots_on(1), 2 + 3);
  EXPECT_EQ(p.slots_on(2), 2 + 0);
  EXPECT_EQ(p.max_slots_per_rank(), 5);
  EXPECT_NO_THROW(p.validate("hand", 5));
}

struct BadPlacement {
  std::string label;
  std::function<void(Placement&)> spoil;
  int max_slots;
  std::vector<std::string> parts;  // expected in the message
};

void PrintTo(const BadPlacement& c, std::ostream* os) { *os << c.label; }

class PlacementValidate : public ::testing::TestWithParam<BadPlacement> {};

TEST_P(PlacementValidate, RefusesWithAnInputErrorNamingTheFault) {
  const auto& c = GetParam();
  Placement p = hand_placement();
  c.spoil(p);
  try {
    p.validate("plan.toml", c.max_slots);
    ADD_FAILURE() << "no error thrown";
  } catch (const Error& e) {
    std::string msg = e.what();
    EXPECT_EQ(e.kind(), ErrorKind::Input) << msg;
    EXPECT_EQ(msg.rfind("plan.toml: ", 0), 0u) << msg;
    for (const auto& part : c.parts)
      EXPECT_NE(msg.find(part), std::string::npos) << "expected '" << part << "' in: " << msg;
  }
}

INSTANTIATE_TEST_SUITE_P(
    Cases, PlacementValidate,
    ::testing::Values(
        BadPlacement{"unplaced", [](Placement& p) { p.set_replicas(1, 2, {}); }, 0,
                     {"layer 1 expert 2", "no slot"}},
        BadPlacement{"rank_too_high", [](Placement& p) { p.set_replicas(1, 2, {0, 3}); }, 0,
                     {"layer 1 expert 2", "rank 3", "0..2"}},
        BadPlacement{"rank_negative", [](Placement& p) { p.set_replicas(0, 1, {-1}); }, 0,
                     {"layer 0 expert 1", "rank -1"}},
        BadPlacement{"rank_twice", [](Placement& p) { p.set_replicas(1, 3, {2, 0, 2}); }, 0,
                     {"layer 1 expert 3", "rank 2 twice"}},
        // Rank 1 holds 5 slots.
        BadPlacement{"over_capacity", [](Placement&) {}, 4, {"rank 1", "5 slots", "capacity of 4"}}),
    [](const auto& info) { return info.param.label; });

std::string shape_name(const ::testing::TestParamInfo<std::tuple<int, int, int>>& info) {
  auto name = [](int v) { return v < 0 ? "m" + std::to_string(-v) : std::to_string(v); };
  const auto [r, l, e] = info.param;
  return "r" + name(r) + "_l" + name(l) + "_e" + name(e);
}

class PlacementShape : public ::testing::TestWithParam<std::tuple<int, int, int>> {};

// A bad shape is a programming error: Internal, and nothing allocated first.
TEST_P(PlacementShape, NonPositiveIsAnInternalError) {
  test::expect_error(
      [this] {
        const auto [r, l, e] = GetParam();
        Placement p(r, l, e);
      },
      ErrorKind::Internal, {});
}

INSTANTIATE_TEST_SUITE_P(Shapes, PlacementShape,
                         ::testing::Values(std::tuple{0, 1, 1}, std::tuple{1, 0, 1},
                                           std::tuple{1, 1, 0}, std::tuple{-1, 2, 2},
                                           std::tuple{2, -1, 2}, std::tuple{2, 2, -1}),
                         shape_name);

TEST(MakePlacement, ByName) {
  EXPECT_EQ(make_placement(kPlacementPolicyNames.parse("contiguous", "policy"), 4, 2, 8, 1), contiguous(4, 2, 8));
  EXPECT_EQ(make_placement(kPlacementPolicyNames.parse("round-robin", "policy"), 4, 2, 8, 1), round_robin(4, 2, 8));
  EXPECT_EQ(make_placement(kPlacementPolicyNames.parse("shuffled", "policy"), 4, 2, 8, 9), shuffled(4, 2, 8, 9));
  for (const auto& policy : kPlacementPolicyNames.entries)
    EXPECT_NO_THROW(make_placement(policy.value, 2, 1, 4, 0)) << policy.name;
}

TEST(MakePlacement, UnknownPolicyIsAUsageError) {
  test::expect_error([] { kPlacementPolicyNames.parse("bogus", "--policy"); }, ErrorKind::Usage,
                     {"\"bogus\"", "round-robin"});
}

}  // namespace
}  // namespace moed::placement
