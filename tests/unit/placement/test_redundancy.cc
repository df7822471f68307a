// Experts on several islands and what a lost rank leaves
// (placement/redundancy.h): redundancy N puts every expert on N islands
// (hottest first, least-loaded islands and ranks), so that losing any one
// island orphans no expert, on placements of every policy and seed; a lost
// rank's slots go, a split copy that lost a shard goes whole, and orphans
// land on the least-loaded survivors, never on a lost rank.
#include "placement/redundancy.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "common/error.h"
#include "placement/optimizer.h"
#include "routing/synthetic_routing.h"
#include "tests/unit/placement/hot_expert_stats.h"
#include "tests/unit/test_support.h"

namespace moed::placement {
namespace {

using test::expect_error;

routing::RoutingStats loads(int layers, int hot) { return test_stats::hot_expert(layers, hot); }

TEST(Redundancy, EveryExpertGetsACopyOnAnotherIsland) {
  const Topology topology({0, 0, 1, 1});
  const Placement p = contiguous(4, 1, 4);  // expert e on rank e: each on one island
  const Placement two = add_island_redundancy(p, loads(1, 3), topology, 2);
  for (int e = 0; e < 4; ++e) {
    EXPECT_EQ(islands_holding(two, topology, 0, e), 2) << "expert " << e;
    EXPECT_EQ(two.replicas(0, e).front(), e) << "the first copy stays";
  }
  // Hot expert 0 first, onto island 1's least-loaded rank (2 and 3 equal: rank 2).
  EXPECT_EQ(two.replicas(0, 0), (std::vector<int>{0, 2}));
  // Expert 2 then goes to island 0, on rank 1 (rank 0 carries half of the hot one).
  EXPECT_EQ(two.replicas(0, 2), (std::vector<int>{2, 1}));
  two.validate("two");
  EXPECT_EQ(two.slots_on(0) + two.slots_on(1) + two.slots_on(2) + two.slots_on(3), 8) << "a slot per copy added";
  // 1 changes nothing; more than the islands is as many as there are; 0 is refused.
  EXPECT_EQ(add_island_redundancy(p, loads(1, 3), topology, 1), p);
  EXPECT_EQ(add_island_redundancy(p, loads(1, 3), topology, 5), two);
  expect_error([&] { add_island_redundancy(p, loads(1, 3), topology, 0); }, ErrorKind::Usage,
               {"[placement].redundancy = 0"});
  // A split expert on one island cannot take a whole replica: refused, naming it.
  Placement split = p;
  split.set_shards(0, 1, {0, 1});
  expect_error([&] { add_island_redundancy(split, loads(1, 3), topology, 2); }, ErrorKind::Usage,
               {"layer 0 expert 1 is split into shards on 1 island(s)", "shard_per_island"});
  // Split with a copy on each island, it already has its two.
  split.set_shards(0, 1, {0, 1, 3, 2}, 2);
  EXPECT_EQ(add_island_redundancy(split, loads(1, 3), topology, 2).replicas(0, 1), (std::vector<int>{0, 1, 3, 2}));
}

TEST(Redundancy, ALostRankLeavesReplicasAndOrphansTheRest) {
  Placement p = contiguous(4, 2, 4);
  p.set_replicas(0, 0, {0, 2});       // survives rank 0's loss
  p.set_shards(1, 1, {0, 1, 2, 3}, 2);  // copy {0, 1} lost with rank 0, copy {2, 3} survives
  const LossPlan plan = drop_lost_ranks(p, {0});
  EXPECT_EQ(plan.survivors.replicas(0, 0), (std::vector<int>{2}));
  EXPECT_EQ(plan.survivors.replicas(1, 1), (std::vector<int>{2, 3}));
  EXPECT_EQ(plan.survivors.shards(1, 1), 2);
  EXPECT_EQ(plan.orphans, (std::vector<std::pair<int, int>>{{1, 0}})) << "layer 1's expert 0 was only on rank 0";
  EXPECT_TRUE(plan.survivors.replicas(1, 0).empty());
  // Losing ranks 0 and 2 as well orphans layer 0's expert 0 and the split expert.
  const LossPlan both = drop_lost_ranks(p, {0, 2});
  EXPECT_EQ(both.orphans, (std::vector<std::pair<int, int>>{{0, 0}, {0, 2}, {1, 0}, {1, 1}, {1, 2}}));
  expect_error([&] { drop_lost_ranks(p, {4}); }, ErrorKind::Input, {"lost rank 4", "0..3"});
}

TEST(Redundancy, OrphansGoToTheLeastLoadedSurvivors) {
  const Placement p = contiguous(4, 1, 4);
  const std::vector<int> lost{0, 1};
  const LossPlan plan = drop_lost_ranks(p, lost);
  ASSERT_EQ(plan.orphans.size(), 2u);
  const Placement adopted = adopt_orphans(plan, loads(1, 3), lost);
  adopted.validate("adopted");
  // Hot expert 0 first to rank 2 (ties: the lower rank), then expert 1 to the lighter rank 3.
  EXPECT_EQ(adopted.replicas(0, 0), (std::vector<int>{2}));
  EXPECT_EQ(adopted.replicas(0, 1), (std::vector<int>{3}));
  EXPECT_EQ(adopted.slots_on(0) + adopted.slots_on(1), 0);
  expect_error([&] { adopt_orphans(drop_lost_ranks(p, {0, 1, 2, 3}), loads(1, 3), {0, 1, 2, 3}); },
               ErrorKind::Runtime, {"every rank of 4 is lost"});
  // Within a capacity of 2 slots per rank both fit as above; at 1, rank 2
  // and 3 are full and the hot orphan has nowhere to go.
  EXPECT_EQ(adopt_orphans(plan, loads(1, 3), lost, 2), adopted);
  expect_error([&] { adopt_orphans(plan, loads(1, 3), lost, 1); }, ErrorKind::Runtime,
               {"layer 0 expert 0 lost its last copy", "2 surviving ranks holds 1 slots"});
  // Rank 2 holding a second slot (half of expert 3): expert 0 takes rank 3's
  // last room at a capacity of 2, and expert 1 finds none.
  Placement uneven = contiguous(4, 1, 4);
  uneven.set_replicas(0, 3, {3, 2});
  expect_error([&] { adopt_orphans(drop_lost_ranks(uneven, lost), loads(1, 3), lost, 2); }, ErrorKind::Runtime,
               {"layer 0 expert 1 lost its last copy"});
  EXPECT_EQ(adopt_orphans(drop_lost_ranks(uneven, lost), loads(1, 3), lost, 3).replicas(0, 1), (std::vector<int>{2}));
}

// On metis's and greedy-load's placements of skewed routing, at several
// seeds: with redundancy 2, losing any one island (or any rank) orphans no
// expert; without it, losing an island does.
class RedundancyHolds : public ::testing::TestWithParam<std::tuple<OptimizerPolicy, std::uint64_t>> {};

TEST_P(RedundancyHolds, LosingAnyIslandOrphansNoExpert) {
  const auto [policy, seed] = GetParam();
  routing::SyntheticRoutingSpec spec{2, 16, 2};
  spec.seed = seed;
  const routing::RoutingTrace trace = routing::synthetic_routing(spec, 0, 2048);
  const routing::RoutingStats stats = routing::RoutingStats::from_trace(trace, 0, trace.tokens());
  const Topology topology = Topology::blocks(6, 2);  // 3 islands of 2 ranks
  OptimizeOptions o;
  o.policy = policy;
  o.redundant_slots = 2;
  o.pooled_share = 0.5;
  const Placement plain = optimize(stats, topology, o);
  const Placement two = add_island_redundancy(plain, stats, topology, 2);
  two.validate("redundant");
  std::size_t orphaned_without = 0;
  for (int island = 0; island < topology.islands(); ++island) {
    const std::vector<int> lost = topology.ranks_in(island);
    EXPECT_TRUE(drop_lost_ranks(two, lost).orphans.empty()) << "island " << island;
    orphaned_without += drop_lost_ranks(plain, lost).orphans.size();
    adopt_orphans(drop_lost_ranks(plain, lost), stats, lost).validate("adopted");
  }
  EXPECT_GT(orphaned_without, 0u) << "the case never needed redundancy";
  for (int r = 0; r < topology.ranks(); ++r) EXPECT_TRUE(drop_lost_ranks(two, {r}).orphans.empty()) << "rank " << r;
}

INSTANTIATE_TEST_SUITE_P(Policies, RedundancyHolds,
                         ::testing::Combine(::testing::Values(OptimizerPolicy::metis, OptimizerPolicy::greedy_load),
                                            ::testing::Values(std::uint64_t(1), std::uint64_t(7), std::uint64_t(23))),
                         [](const auto& info) {
                           return std::string(std::get<0>(info.param) == OptimizerPolicy::metis ? "Metis" : "Greedy") +
                                  "Seed" + std::to_string(std::get<1>(info.param));
                         });

}  // namespace
}  // namespace moed::placement
