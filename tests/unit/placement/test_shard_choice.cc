// The optimiser's choice to split hot experts (placement/shard_choice.h):
// replicas become shards on one island (or a copy of shards on each island
// of them, per_island), an unreplicated hot expert is split
// when its island's ranks can hold 1/S more, cold experts and small islands
// are left alone, and the result is a valid placement for the run's rules.
#include "placement/shard_choice.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "placement/placement_diff.h"
#include "placement/shard_rules.h"
#include "tests/unit/placement/hot_expert_stats.h"
#include "tests/unit/test_support.h"

namespace moed::placement {
namespace {

routing::RoutingStats loads(int layers, int hot) { return test_stats::hot_expert(layers, hot); }

TEST(ShardChoice, ReplicasOfAHotExpertBecomeShardsOnTheirIsland) {
  const Topology topology({0, 0, 1, 1});
  Placement p = contiguous(4, 1, 4);  // expert e on rank e
  p.set_replicas(0, 0, {0, 2, 1});    // hot expert 0 replicated, two copies on island 0
  const Placement out = split_hot_experts(p, loads(1, 3), topology, {.over_mean = 1.5, .shards = 2});
  EXPECT_EQ(out.shards(0, 0), 2);
  EXPECT_EQ(out.replicas(0, 0), (std::vector<int>{0, 1}));
  for (int e = 1; e < 4; ++e) EXPECT_EQ(out.replicas(0, e), p.replicas(0, e)) << "cold expert " << e;
  out.validate("split");
  check_shards(out, 2, topology, "split");
}

// per_island: a copy of S shards on each island of the replicas, so tokens
// keep a near copy; an island too small for S shards loses its replica.
TEST(ShardChoice, PerIslandKeepsACopyOfShardsOnEachIslandOfTheReplicas) {
  const Topology topology({0, 0, 1, 1, 2});
  Placement p(5, 1, 4);
  for (int e = 0; e < 4; ++e) p.set_replicas(0, e, {e});
  p.set_replicas(0, 0, {0, 3, 4});  // hot expert 0 on islands 0, 1 and 2 (island 2: one rank)
  const ShardRule rule{.over_mean = 1.5, .shards = 2, .per_island = true};
  const Placement out = split_hot_experts(p, loads(1, 3), topology, rule);
  EXPECT_EQ(out.shards(0, 0), 2);
  EXPECT_EQ(out.copies(0, 0), 2);
  EXPECT_EQ(out.replicas(0, 0), (std::vector<int>{0, 1, 3, 2})) << "holders first in each copy";
  out.validate("per island");
  check_shards(out, 2, topology, "per island");
  // Without per_island: one copy, on the first island of the tie.
  const Placement one = split_hot_experts(p, loads(1, 3), topology, {.over_mean = 1.5, .shards = 2});
  EXPECT_EQ(one.replicas(0, 0), (std::vector<int>{0, 1}));
  // A memory budget applies to every copy's ranks: rank 1 and 2 hold an expert, half more fits 1.5.
  EXPECT_EQ(split_hot_experts(p, loads(1, 3), topology, {.over_mean = 1.5, .shards = 2, .slots_per_rank = 1.5,
                                                        .per_island = true}),
            out);
  EXPECT_EQ(split_hot_experts(p, loads(1, 3), topology, {.over_mean = 1.5, .shards = 2, .slots_per_rank = 1.2,
                                                        .per_island = true}),
            p);
}

TEST(ShardChoice, AnUnreplicatedHotExpertIsSplitOntoTheLeastLoadedRankOfItsIsland) {
  const Topology topology({0, 0, 0, 1});
  Placement p(4, 1, 4);
  p.set_replicas(0, 0, {1});
  p.set_replicas(0, 1, {0});
  p.set_replicas(0, 2, {0});
  p.set_replicas(0, 3, {3});
  const Placement out = split_hot_experts(p, loads(1, 4), topology, {.over_mean = 2, .shards = 2});
  EXPECT_EQ(out.replicas(0, 0), (std::vector<int>{1, 2})) << "rank 2 holds nothing in the layer";
  // Within a budget of 1 expert per rank per layer, rank 2 can take half of one; rank 0 could not.
  EXPECT_EQ(split_hot_experts(p, loads(1, 4), topology, {.over_mean = 2, .shards = 2, .slots_per_rank = 1}), out);
  p.set_replicas(0, 3, {2});  // now every rank of island 0 holds an expert
  EXPECT_EQ(split_hot_experts(p, loads(1, 4), topology, {.over_mean = 2, .shards = 2, .slots_per_rank = 1}), p)
      << "no rank of the island has room for a shard";
  EXPECT_EQ(split_hot_experts(p, loads(1, 4), topology, {.over_mean = 2, .shards = 2, .slots_per_rank = 1.5})
                .shards(0, 0),
            2);
}

TEST(ShardChoice, ColdExpertsSmallIslandsAndTheOffSwitchLeaveThePlacement) {
  const Placement p = contiguous(4, 2, 4);
  const auto stats = loads(2, 3);
  EXPECT_EQ(split_hot_experts(p, stats, Topology({0, 0, 1, 1}), {.over_mean = 0}), p);
  EXPECT_EQ(split_hot_experts(p, stats, Topology({0, 0, 1, 1}), {.over_mean = 3.5}), p) << "twice the mean is not over 3.5 times";
  EXPECT_EQ(split_hot_experts(p, stats, Topology({0, 1, 2, 3}), {.over_mean = 1.5}), p) << "islands of one rank";
  const Placement four = split_hot_experts(p, stats, Topology({0, 0, 0, 0}), {.over_mean = 1.5, .shards = 4});
  EXPECT_EQ(four.shards(1, 0), 4);
  check_shards(four, 8, Topology({0, 0, 0, 0}), "four");
  test::expect_error([&] { split_hot_experts(p, stats, Topology({0, 0, 1, 1}), {.over_mean = 2, .shards = 1}); },
                     ErrorKind::Usage, {"at least 2 shards"});
}

TEST(ShardChoice, AReoptimisationKeepsTheCurrentSplits) {
  Placement current = contiguous(4, 2, 4);
  current.set_shards(1, 2, {3, 2});
  current.set_shards(0, 1, {0, 1, 2, 3}, 2);  // held twice: kept as two copies, not four shards
  const Placement next = shuffled(4, 2, 4, 9);
  const Placement kept = keep_splits(current, next);
  EXPECT_EQ(kept.replicas(1, 2), (std::vector<int>{3, 2}));
  EXPECT_EQ(kept.shards(1, 2), 2);
  for (int l = 0; l < 2; ++l)
    for (int e = 0; e < 4; ++e)
      if ((l != 1 || e != 2) && (l != 0 || e != 1)) {
        EXPECT_EQ(kept.replicas(l, e), next.replicas(l, e));
      }
  EXPECT_EQ(kept.shards(0, 1), 2);
  EXPECT_EQ(kept.copies(0, 1), 2);
  for (const Move& m : moves(current, kept)) EXPECT_FALSE(m.layer == 1 && m.expert == 2) << "the split moved";
}

}  // namespace
}  // namespace moed::placement
