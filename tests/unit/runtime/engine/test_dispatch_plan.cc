// Where a layer's pairs go (runtime/engine/dispatch_plan.h): counts, row
// batches, flat plans by hand, the chunk rule and its replica choice (near
// the chunk's rows, rotating with the step), gateways, hierarchical plans
// through them, and a split expert's rows (a pair per shard, a remote row
// crossing once and fanned out at the gateway; with copies, each chunk to
// every shard of one copy).
#include "runtime/engine/dispatch_plan.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "common/error.h"
#include "placement/placement.h"
#include "placement/topology.h"
#include "runtime/engine/chunk_schedule.h"
#include "runtime/router/router.h"
#include "tests/unit/runtime/engine/plan_test_support.h"

namespace moed::runtime {
namespace {

using placement::Placement;
using placement::Topology;

// ---------------------------------------------------------------- ExpertCounts

TEST(ExpertCounts, LocalCountsPairsPerExpert) {
  const Routing r = make_routing({{{1, .5f}, {2, .5f}}, {{2, .7f}, {3, .3f}}, {{1, 1}}, {}});
  EXPECT_EQ(ExpertCounts::local(r, 5), (std::vector<std::uint32_t>{0, 2, 2, 1, 0}));
  EXPECT_EQ(ExpertCounts::local(Routing{}, 3), (std::vector<std::uint32_t>{0, 0, 0}));
}

TEST(ExpertCounts, TotalAndBefore) {
  const ExpertCounts c = counts_of({{1, 2, 3, 4}, {0, 5, 0, 1}, {2, 0, 7, 1}});
  EXPECT_EQ(c.ranks(), 3);
  EXPECT_EQ(c.experts(), 4);
  EXPECT_EQ(c.at(1, 1), 5u);
  EXPECT_EQ(c.at(2, 2), 7u);
  const std::uint64_t totals[] = {3, 7, 10, 6};
  for (int e = 0; e < 4; ++e) {
    EXPECT_EQ(c.total(e), totals[e]) << "expert " << e;
    EXPECT_EQ(c.before(0, e), 0u) << "expert " << e;
    EXPECT_EQ(c.before(3, e), totals[e]) << "expert " << e;  // all ranks
  }
  EXPECT_EQ(c.before(1, 0), 1u);
  EXPECT_EQ(c.before(2, 1), 7u);
  EXPECT_EQ(c.before(2, 2), 3u);
  EXPECT_EQ(c.before(1, 3), 4u);
}

// ---------------------------------------------------------------- RowBatch

TEST(RowBatch, AddStartsARowUnlessTheLastRowIsThatTokens) {
  const float a[1] = {1}, b[1] = {2};
  RowBatch batch;
  batch.add(5, 0, a, 1, .5f, 3);
  batch.add(5, 0, a, 2, .25f, 3);  // same token: the same row, a second pair
  batch.add(7, -4, b, 0, 1, 2);
  batch.add(5, 0, a, 4, .25f, 3);  // token 5 again, but not last: a new row
  EXPECT_EQ(batch.rows(), 3u);
  EXPECT_EQ(batch.token, (std::vector<std::uint64_t>{5, 7, 5}));
  EXPECT_EQ(batch.origin, (std::vector<std::int64_t>{0, -4, 0}));
  EXPECT_EQ(batch.data, (std::vector<const float*>{a, b, a}));
  EXPECT_EQ(batch.pair_offsets, (std::vector<std::uint32_t>{0, 2, 3, 4}));
  EXPECT_EQ(batch.experts, (std::vector<std::uint32_t>{1, 2, 0, 4}));
  EXPECT_EQ(batch.weights, (std::vector<float>{.5f, .25f, 1, .25f}));
  EXPECT_EQ(batch.dests, (std::vector<std::uint32_t>{3, 3, 2, 3}));
  EXPECT_EQ(batch.pairs_of(0), 2u);
  EXPECT_EQ(batch.pairs_of(2), 1u);
}

// ---------------------------------------------------------------- plan_dispatch by hand


TEST(PlanDispatch, TwoExpertsOnOneRankTravelOnce) {
  // Experts 0, 1 on rank 0; 2, 3 on rank 1. This rank's tokens are global 40, 41, 42.
  const Placement p = placement::contiguous(2, 1, 4);
  const Routing r = make_routing({{{0, .6f}, {1, .4f}},      // both on rank 0: one row, two pairs
                                  {{2, .7f}, {0, .3f}},      // one row to each rank
                                  {{3, .55f}, {2, .45f}}});  // both on rank 1
  const ExpertCounts c = counts_of({ExpertCounts::local(r, 4), {0, 0, 0, 0}});
  PlanInput in = plan_input(r, p, c, 0);
  in.first_token = 40;
  const std::vector<float> x = token_rows(3, 2);
  const DispatchPlan plan = plan_dispatch(in, x.data(), 2);
  ASSERT_EQ(plan.hop1.size(), 2u);
  ASSERT_EQ(plan.hop2.size(), 2u);
  expect_empty(plan.hop1);  // flat: no gateways
  expect_batch(plan.hop2[0], {.token = {40, 41}, .origin = {0, 1}, .pair_offsets = {0, 2, 3},
                              .experts = {0, 1, 0}, .weights = {.6f, .4f, .3f}, .dests = {0, 0, 0}},
               x.data(), 2);
  expect_batch(plan.hop2[1], {.token = {41, 42}, .origin = {1, 2}, .pair_offsets = {0, 1, 3},
                              .experts = {2, 3, 2}, .weights = {.7f, .55f, .45f}, .dests = {1, 1, 1}},
               x.data(), 2);
  EXPECT_EQ(plan.hop2[0].pairs_of(0), 2u);
  EXPECT_EQ(plan.hop2[0].pairs_of(1), 1u);
  EXPECT_EQ(plan.hop2[1].pairs_of(1), 2u);
}

TEST(PlanDispatch, ExpertsOnThreeRanksMakeThreeRows) {
  Placement p(3, 1, 3);
  for (int e = 0; e < 3; ++e) p.set_replicas(0, e, {2 - e});  // expert e on rank 2 - e
  const Routing r = make_routing({{{0, .5f}, {1, .3f}, {2, .2f}}});
  const ExpertCounts c = counts_of({{1, 1, 1}, {0, 0, 0}, {0, 0, 0}});
  const std::vector<float> x = token_rows(1, 3);
  const DispatchPlan plan = plan_dispatch(plan_input(r, p, c, 0), x.data(), 3);
  ASSERT_EQ(plan.hop2.size(), 3u);
  expect_batch(plan.hop2[2], {{0}, {0}, {0, 1}, {0}, {.5f}, {2}}, x.data(), 3);
  expect_batch(plan.hop2[1], {{0}, {0}, {0, 1}, {1}, {.3f}, {1}}, x.data(), 3);
  expect_batch(plan.hop2[0], {{0}, {0}, {0, 1}, {2}, {.2f}, {0}}, x.data(), 3);
}

TEST(PlanDispatch, RowsPerDestinationAreInTokenOrder) {
  const Placement p = placement::round_robin(2, 1, 4);  // even experts on rank 0, odd on rank 1
  const Routing r = make_routing(
      {{{1, 1}}, {{0, 1}}, {{3, .5f}, {2, .5f}}, {{2, 1}}, {{1, .5f}, {3, .5f}}, {}});
  const ExpertCounts c = counts_of({ExpertCounts::local(r, 4), {0, 0, 0, 0}});
  PlanInput in = plan_input(r, p, c, 0);
  in.first_token = 7;  // global id = 7 + local index
  const DispatchPlan plan = plan_dispatch(in, token_rows(6, 1).data(), 1);
  EXPECT_EQ(plan.hop2[0].origin, (std::vector<std::int64_t>{1, 2, 3}));
  EXPECT_EQ(plan.hop2[0].token, (std::vector<std::uint64_t>{8, 9, 10}));
  EXPECT_EQ(plan.hop2[1].origin, (std::vector<std::int64_t>{0, 2, 4}));
  EXPECT_EQ(plan.hop2[1].token, (std::vector<std::uint64_t>{7, 9, 11}));
  EXPECT_EQ(plan.hop2[1].experts, (std::vector<std::uint32_t>{1, 3, 1, 3}));
}

TEST(PlanDispatch, TheLayerSelectsThePlacement) {
  Placement p(2, 2, 2);
  p.set_replicas(0, 0, {0});
  p.set_replicas(0, 1, {0});
  p.set_replicas(1, 0, {1});
  p.set_replicas(1, 1, {1});
  const Routing r = make_routing({{{0, .5f}, {1, .5f}}});
  const ExpertCounts c = counts_of({{1, 1}, {0, 0}});
  const std::vector<float> x = token_rows(1, 1);
  EXPECT_EQ(plan_dispatch(plan_input(r, p, c, 0, 1, 0, 0), x.data(), 1).hop2[0].rows(), 1u);
  EXPECT_EQ(plan_dispatch(plan_input(r, p, c, 0, 1, 0, 1), x.data(), 1).hop2[1].rows(), 1u);
  EXPECT_EQ(plan_dispatch(plan_input(r, p, c, 0, 1, 0, 1), x.data(), 1).hop2[0].rows(), 0u);
}

// Expert 0 has two replicas, on ranks 2 (replica 0) and 0 (replica 1); expert 1 is on rank 1.
// Counts of expert 0: rank 0 has 3 pairs, rank 1 has 4, rank 2 has 2. Rank 1's pairs of
// expert 0 hold global positions 3, 4, 5, 6; with chunks of 2 rows they are in chunks
// 1, 2, 2, 3.
class PlanReplicas : public ::testing::Test {
 protected:
  PlanReplicas() : p(3, 1, 2) {
    p.set_replicas(0, 0, {2, 0});
    p.set_replicas(0, 1, {1});
  }
  DispatchPlan plan_as(const ExpertCounts& counts, int rank, std::uint64_t step) {
    PlanInput in = plan_input(r, p, counts, rank, 2, step);
    in.first_token = 100;
    return plan_dispatch(in, x.data(), 1);
  }
  Placement p;
  const Routing r = make_routing({{{0, 1}},                // position 3
                                  {{0, .6f}, {1, .4f}},    // position 4
                                  {{1, .7f}, {0, .3f}},    // position 5
                                  {{0, 1}}});              // position 6
  const ExpertCounts c = counts_of({{3, 0}, {4, 2}, {2, 0}});
  const std::vector<float> x = token_rows(4, 1);
};

TEST_F(PlanReplicas, ChunkJGoesToReplicaJPlusStepModR) {
  // step 1: chunks 1, 2, 2, 3 -> replicas 0, 1, 1, 0 -> ranks 2, 0, 0, 2.
  const DispatchPlan plan = plan_as(c, 1, 1);
  expect_batch(plan.hop2[2], {{100, 103}, {0, 3}, {0, 1, 2}, {0, 0}, {1, 1}, {2, 2}}, x.data(), 1);
  expect_batch(plan.hop2[0], {{101, 102}, {1, 2}, {0, 1, 2}, {0, 0}, {.6f, .3f}, {0, 0}}, x.data(), 1);
  expect_batch(plan.hop2[1], {{101, 102}, {1, 2}, {0, 1, 2}, {1, 1}, {.4f, .7f}, {1, 1}}, x.data(), 1);
  expect_empty(plan.hop1);
}

TEST_F(PlanReplicas, TheStepRotatesTheReplicas) {
  // step 0: chunks 1, 2, 2, 3 -> replicas 1, 0, 0, 1 -> ranks 0, 2, 2, 0.
  const DispatchPlan plan = plan_as(c, 1, 0);
  expect_batch(plan.hop2[0], {{100, 103}, {0, 3}, {0, 1, 2}, {0, 0}, {1, 1}, {0, 0}}, x.data(), 1);
  expect_batch(plan.hop2[2], {{101, 102}, {1, 2}, {0, 1, 2}, {0, 0}, {.6f, .3f}, {2, 2}}, x.data(), 1);
}

TEST_F(PlanReplicas, PositionsStartAfterTheLowerRanks) {
  // The same routing planned as rank 0 (positions 0..3, chunks 0, 0, 1, 1), step 0:
  // replicas 0, 0, 1, 1 -> ranks 2, 2, 0, 0.
  const ExpertCounts c0 = counts_of({{4, 2}, {3, 0}, {2, 0}});
  const DispatchPlan plan = plan_as(c0, 0, 0);
  expect_batch(plan.hop2[2], {{100, 101}, {0, 1}, {0, 1, 2}, {0, 0}, {1, .6f}, {2, 2}}, x.data(), 1);
  expect_batch(plan.hop2[0], {{102, 103}, {2, 3}, {0, 1, 2}, {0, 0}, {.3f, 1}, {0, 0}}, x.data(), 1);
}

// With islands, a chunk goes to a replica on the island most of its rows come
// from. Islands {0, 1} and {2, 3}; expert 0 has replicas on ranks 1 and 3.
// Counts of expert 0: rank 0 has 5 rows (positions 0-4), rank 2 has 3 (5-7).
// Chunks of 4 rows: chunk 0 = positions 0-3, all from island 0 -> rank 1;
// chunk 1 = positions 4-7: 1 row from island 0, 3 from island 1 -> rank 3.
TEST(ChunkReplica, FollowsTheIslandOfMostOfTheChunksRows) {
  Placement p(4, 1, 2);
  p.set_replicas(0, 0, {1, 3});
  p.set_replicas(0, 1, {0});
  const ExpertCounts c = counts_of({{5, 0}, {0, 0}, {3, 0}, {0, 0}});
  const Topology islands = Topology::blocks(4, 2);
  const Routing none;
  for (std::uint64_t step : {0, 1, 5}) {
    for (bool hierarchical : {false, true}) {  // the route does not change the chunk rule
      PlanInput in{&none, &p, 0, &c, 0, 4, step, &islands, hierarchical};
      EXPECT_EQ(p.replicas(0, 0)[chunk_replica(in, 0, 0)], 1) << "step " << step;
      EXPECT_EQ(p.replicas(0, 0)[chunk_replica(in, 0, 1)], 3) << "step " << step;
    }
  }
  // Without a topology the replicas rotate: chunk j -> replica (j + step) mod 2.
  PlanInput flat{&none, &p, 0, &c, 0, 4, 1, nullptr};
  EXPECT_EQ(chunk_replica(flat, 0, 0), 1u);
  EXPECT_EQ(chunk_replica(flat, 0, 1), 0u);
}

// Two replicas on the island the rows come from rotate with the step; an
// island with no replica falls back to all replicas.
TEST(ChunkReplica, RotatesAmongTheNearReplicasAndFallsBackToAll) {
  Placement p(4, 1, 1);
  p.set_replicas(0, 0, {0, 1, 2});
  const ExpertCounts from_island0 = counts_of({{8}, {0}, {0}, {0}});
  const ExpertCounts from_island1 = counts_of({{0}, {0}, {0}, {8}});
  const Topology islands = Topology::blocks(4, 2);
  const Routing none;
  PlanInput a{&none, &p, 0, &from_island0, 0, 8, 0, &islands};
  EXPECT_EQ(chunk_replica(a, 0, 0), 0u);  // near replicas {0, 1}: (0 + 0) mod 2
  a.step = 1;
  EXPECT_EQ(chunk_replica(a, 0, 0), 1u);
  PlanInput b{&none, &p, 0, &from_island1, 0, 8, 0, &islands};
  EXPECT_EQ(chunk_replica(b, 0, 0), 2u);  // rank 2 is the only replica on island 1
  Placement q(4, 1, 1);
  q.set_replicas(0, 0, {0, 1});
  PlanInput c{&none, &q, 0, &from_island1, 0, 8, 1, &islands};
  EXPECT_EQ(chunk_replica(c, 0, 0), 1u);  // none on island 1: all replicas, (0 + 1) mod 2
}

TEST(ReplicaOfChunk, IsChunkPlusStepModReplicas) {
  EXPECT_EQ(replica_of_chunk(0, 0, 1), 0u);
  EXPECT_EQ(replica_of_chunk(5, 0, 1), 0u);
  EXPECT_EQ(replica_of_chunk(0, 0, 3), 0u);
  EXPECT_EQ(replica_of_chunk(1, 0, 3), 1u);
  EXPECT_EQ(replica_of_chunk(2, 2, 3), 1u);
  EXPECT_EQ(replica_of_chunk(4, 7, 2), 1u);
}

// An expert's chunk size: chunk_rows, or, where small experts are shared,
// its rows divided among its replicas (rounded up) when that is smaller.
TEST(ExpertChunkRows, SmallReplicatedExpertsAreCutOnePerReplica) {
  Placement p(4, 1, 5);
  p.set_replicas(0, 0, {0});           // one slot
  p.set_replicas(0, 1, {0, 1});        // 2 replicas, 10 rows
  p.set_replicas(0, 2, {1, 2, 3});     // 3 replicas, 10 rows
  p.set_replicas(0, 3, {2, 3});        // 2 replicas, no rows
  p.set_shards(0, 4, {2, 3});          // split: every shard computes every chunk
  const ExpertCounts counts = counts_of({{3, 4, 4, 0, 2}, {3, 6, 6, 0, 2}, {0, 0, 0, 0, 0}, {0, 0, 0, 0, 0}});
  PlanInput in{nullptr, &p, 0, &counts, 0, 8, 0, nullptr, false};
  for (int e = 0; e < 5; ++e) EXPECT_EQ(expert_chunk_rows(in, e), 8u) << "expert " << e << ": not shared";
  in.share_small_experts = true;
  EXPECT_EQ(expert_chunk_rows(in, 0), 8u);
  EXPECT_EQ(expert_chunk_rows(in, 1), 5u);
  EXPECT_EQ(expert_chunk_rows(in, 2), 4u);  // ceil(10 / 3)
  EXPECT_EQ(expert_chunk_rows(in, 3), 1u);  // at least 1
  EXPECT_EQ(expert_chunk_rows(in, 4), 8u);
  in.chunk_rows = 3;  // never above chunk_rows
  EXPECT_EQ(expert_chunk_rows(in, 1), 3u);
  // Home 1's pairs, by hand. Shared: expert 1 in chunks of 5 (its position
  // 4 to rank 0, 5-9 to rank 1), expert 2 in chunks of 4 (positions 4-7 to
  // rank 2, 8-9 to rank 3). Whole chunks of 8: expert 1's positions 4-7 to
  // rank 0, 8-9 to rank 1; expert 2's 4-7 to rank 1, 8-9 to rank 2.
  in.chunk_rows = 8;
  EXPECT_EQ(pairs_to_ranks(in, 1), (std::vector<std::uint64_t>{3 + 1, 5, 4 + 2, 2 + 2}));
  in.share_small_experts = false;
  EXPECT_EQ(pairs_to_ranks(in, 1), (std::vector<std::uint64_t>{3 + 4, 2 + 4, 2 + 2, 2}));
}

// ---------------------------------------------------------------- gateways

// gateway(home, island) is the rank of `island` whose index there is the home's
// index within its own island, modulo the size of `island`.
struct GatewayCase {
  const char* name;
  std::vector<int> island_of_rank;
  std::vector<std::vector<int>> gateway;  // [home][island], by hand
};

class Gateway : public ::testing::TestWithParam<GatewayCase> {};

TEST_P(Gateway, IsTheRankWithTheHomesIndexModuloTheIslandsSize) {
  const Topology t(GetParam().island_of_rank);
  ASSERT_EQ(std::size_t(t.ranks()), GetParam().gateway.size());
  for (int home = 0; home < t.ranks(); ++home) {
    ASSERT_EQ(std::size_t(t.islands()), GetParam().gateway[home].size());
    for (int island = 0; island < t.islands(); ++island) {
      const int g = gateway(t, home, island);
      EXPECT_EQ(g, GetParam().gateway[home][island]) << "home " << home << " island " << island;
      EXPECT_EQ(t.island_of(g), island);
    }
    EXPECT_EQ(gateway(t, home, t.island_of(home)), home) << "a home is its own island's gateway";
  }
}

INSTANTIATE_TEST_SUITE_P(
    Topologies, Gateway,
    ::testing::Values(
        // blocks(8, 2): {0,1} {2,3} {4,5} {6,7}; index = home mod 2 -> rank 2 i + home mod 2.
        GatewayCase{"Blocks8By2",
                    {0, 0, 1, 1, 2, 2, 3, 3},
                    {{0, 2, 4, 6}, {1, 3, 5, 7}, {0, 2, 4, 6}, {1, 3, 5, 7},
                     {0, 2, 4, 6}, {1, 3, 5, 7}, {0, 2, 4, 6}, {1, 3, 5, 7}}},
        // blocks(6, 3): {0,1,2} {3,4,5}; index = home mod 3 -> rank 3 i + home mod 3.
        GatewayCase{"Blocks6By3",
                    {0, 0, 0, 1, 1, 1},
                    {{0, 3}, {1, 4}, {2, 5}, {0, 3}, {1, 4}, {2, 5}}},
        // Uneven {0,1,2} {3,4} {5}: home 2 (index 2) -> island 1 index 2 mod 2 = 0 (rank 3),
        // island 2 index 2 mod 1 = 0 (rank 5); home 4 (index 1) -> rank 1 of island 0.
        GatewayCase{"Uneven321",
                    {0, 0, 0, 1, 1, 2},
                    {{0, 3, 5}, {1, 4, 5}, {2, 3, 5}, {0, 3, 5}, {1, 4, 5}, {0, 3, 5}}},
        // Interleaved: island 0 = {1, 3}, island 1 = {0, 2}. Home 2 has index 1 in {0, 2}:
        // island 0's rank of index 1 is 3.
        GatewayCase{"Interleaved", {1, 0, 1, 0}, {{1, 0}, {1, 0}, {3, 2}, {3, 2}}}),
    [](const ::testing::TestParamInfo<GatewayCase>& info) { return info.param.name; });

// ---------------------------------------------------------------- hierarchical planning by hand

// Islands {0, 1} and {2, 3}; expert e on rank e. Three tokens (global 10, 11, 12):
//   token 10: experts 2, 3 (two ranks of the remote island) and 1;
//   token 11: experts 0 and 1, all in the home's island (homes 0 and 1);
//   token 12: expert 3 only.
// Hierarchical from home 0: one hop-1 row per (token, remote island), to the
// gateway (home 0 -> rank 2, home 1 -> rank 3), carrying the remote pairs and
// their dests; own-island pairs go straight out in hop 2.
class PlanHierarchical : public ::testing::TestWithParam<int> {
 protected:
  PlanHierarchical() : p(4, 1, 4) {
    for (int e = 0; e < 4; ++e) p.set_replicas(0, e, {e});
  }
  DispatchPlan make_plan(const Topology* t, bool hierarchical) const {
    PlanInput in = plan_input(r, p, c, GetParam());
    in.topology = t;
    in.hierarchical = hierarchical;
    in.first_token = 10;
    return plan_dispatch(in, x.data(), 2);
  }
  Placement p;
  const Routing r = make_routing({{{2, .5f}, {3, .3f}, {1, .2f}},  // 10
                                  {{0, .6f}, {1, .4f}},            // 11
                                  {{3, 1}}});                      // 12
  const ExpertCounts c = counts_of({{0, 0, 0, 0}, {0, 0, 0, 0}, {0, 0, 0, 0}, {0, 0, 0, 0}});
  const std::vector<float> x = token_rows(3, 2);
  const Topology two = Topology::blocks(4, 2);
};

TEST_P(PlanHierarchical, RemotePairsCrossOnceToTheGateway) {
  const int home = GetParam(), g = home == 0 ? 2 : 3;
  ASSERT_EQ(gateway(two, home, 1), g);
  const DispatchPlan plan = make_plan(&two, true);
  ASSERT_EQ(plan.hop1.size(), 4u);
  ASSERT_EQ(plan.hop2.size(), 4u);
  // Hop 1: token 10 once with both remote pairs, token 12 with its one; token 11 not at all.
  expect_batch(plan.hop1[g], {.token = {10, 12}, .origin = {0, 2}, .pair_offsets = {0, 2, 3},
                              .experts = {2, 3, 3}, .weights = {.5f, .3f, 1}, .dests = {2, 3, 3}},
               x.data(), 2);
  for (int d = 0; d < 4; ++d)
    if (d != g) {
      EXPECT_EQ(plan.hop1[d].rows(), 0u) << "hop 1 to rank " << d;
    }
  // Hop 2: only the home island.
  expect_batch(plan.hop2[0], {{11}, {1}, {0, 1}, {0}, {.6f}, {0}}, x.data(), 2);
  expect_batch(plan.hop2[1], {{10, 11}, {0, 1}, {0, 1, 2}, {1, 1}, {.2f, .4f}, {1, 1}}, x.data(), 2);
  EXPECT_EQ(plan.hop2[2].rows(), 0u);
  EXPECT_EQ(plan.hop2[3].rows(), 0u);
}

TEST_P(PlanHierarchical, FlatOrOneIslandSendsEverythingDirect) {
  const Topology one = Topology::blocks(4, 4);
  const DispatchPlan flat = make_plan(&two, false);
  for (const DispatchPlan& plan : {flat, make_plan(&one, true), make_plan(nullptr, true)}) {
    expect_empty(plan.hop1);
    expect_batch(plan.hop2[0], {{11}, {1}, {0, 1}, {0}, {.6f}, {0}}, x.data(), 2);
    expect_batch(plan.hop2[1], {{10, 11}, {0, 1}, {0, 1, 2}, {1, 1}, {.2f, .4f}, {1, 1}}, x.data(), 2);
    expect_batch(plan.hop2[2], {{10}, {0}, {0, 1}, {2}, {.5f}, {2}}, x.data(), 2);
    expect_batch(plan.hop2[3], {{10, 12}, {0, 2}, {0, 1, 2}, {3, 3}, {.3f, 1}, {3, 3}}, x.data(), 2);
  }
  // Flat: token 10 crosses twice (to ranks 2 and 3) and 12 once: 3 cross-island rows;
  // hierarchical: 2 (one per token that has an expert over there).
  EXPECT_EQ(flat.hop2[2].rows() + flat.hop2[3].rows(), 3u);
  EXPECT_EQ(make_plan(&two, true).hop1[gateway(two, GetParam(), 1)].rows(), 2u);
}

INSTANTIATE_TEST_SUITE_P(Homes, PlanHierarchical, ::testing::Values(0, 1),
                         [](const ::testing::TestParamInfo<int>& info) {
                           return "Home" + std::to_string(info.param);
                         });

// A split expert (placement.h): each pair goes to every shard; a home on
// another island sends its row once, to the gateway, with a pair per shard,
// and the gateway fans it out. Every shard computes every chunk.
TEST(SplitExpert, EveryShardGetsEveryRowAndARemoteRowCrossesOnce) {
  const int H = 4;
  Placement p(4, 1, 3);
  p.set_replicas(0, 0, {0});
  p.set_shards(0, 1, {2, 3});  // island 1
  p.set_replicas(0, 2, {1});
  const Topology topology({0, 0, 1, 1});
  const Routing routing = make_routing({{{1, 0.5f}, {0, 0.5f}}, {{1, 1.0f}}, {{2, 1.0f}}});
  const ExpertCounts counts = counts_of({{1, 2, 1}, {0, 0, 0}, {0, 0, 0}, {0, 0, 0}});
  const std::vector<float> x = token_rows(3, H);
  PlanInput in{&routing, &p, 0, &counts, 0, 2, 0, &topology, false};
  EXPECT_EQ(pairs_to_ranks(in, 0), (std::vector<std::uint64_t>{1, 1, 2, 2}));
  const DispatchPlan flat = plan_dispatch(in, x.data(), H);
  for (int shard_rank : {2, 3}) {
    EXPECT_EQ(flat.hop2[shard_rank].rows(), 2u);
    EXPECT_EQ(flat.hop2[shard_rank].experts, (std::vector<std::uint32_t>{1, 1}));
    EXPECT_EQ(flat.hop2[shard_rank].dests, (std::vector<std::uint32_t>{std::uint32_t(shard_rank), std::uint32_t(shard_rank)}));
  }
  in.hierarchical = true;
  const DispatchPlan two_hops = plan_dispatch(in, x.data(), H);
  const RowBatch& crossing = two_hops.hop1[gateway(topology, 0, 1)];
  EXPECT_EQ(crossing.rows(), 2u) << "each token crosses once";
  EXPECT_EQ(crossing.dests, (std::vector<std::uint32_t>{2, 3, 2, 3}));
  Received hop1;
  std::vector<RowBatch> to_gateway(4);
  to_gateway[std::size_t(gateway(topology, 0, 1))] = crossing;
  receive(to_gateway, H, hop1);
  DispatchPlan forwarded;
  forwarded.hop2.resize(4);
  plan_forward(hop1.rows, H, forwarded);
  EXPECT_EQ(forwarded.hop2[2].rows(), 2u);
  EXPECT_EQ(forwarded.hop2[3].rows(), 2u);
  // The shards' schedules: each computes all of the expert's rows.
  for (int shard_rank : {2, 3}) {
    in.rank = shard_rank;
    const ChunkSchedule s = schedule_chunks(in, true);
    ASSERT_EQ(s.experts, (std::vector<int>{1}));
    EXPECT_EQ(s.rows_from[0][0], 2u);
  }
  EXPECT_EQ(chunk_replica(in, 1, 0), 0u);  // held once: its one copy computes every chunk
}

// A split expert held twice (a copy of 2 shards on each island): each chunk
// of its rows goes to the copy near them, and to every shard of that copy.
TEST(SplitExpert, EachChunkGoesToEveryShardOfOneCopy) {
  const int H = 2;
  Placement p(4, 1, 2);
  p.set_replicas(0, 0, {0});
  p.set_shards(0, 1, {1, 0, 3, 2}, 2);  // copy 0 on island 0, copy 1 on island 1
  const Topology topology({0, 0, 1, 1});
  // Rank 0 routes 2 tokens to expert 1 (positions 0-1), rank 2 routes 3 (positions 2-4).
  const ExpertCounts counts = counts_of({{0, 2}, {0, 0}, {0, 3}, {0, 0}});
  const Routing mine = make_routing({{{1, 1.0f}}, {{1, 0.5f}}});
  const std::vector<float> x = token_rows(3, H);
  PlanInput in{&mine, &p, 0, &counts, 0, 2, 0, &topology, false};
  // Chunks of 2: [0, 2) from island 0 -> copy 0; [2, 4) and [4, 5) from island 1 -> copy 1.
  EXPECT_EQ(chunk_replica(in, 1, 0), 0u);
  EXPECT_EQ(chunk_replica(in, 1, 1), 1u);
  EXPECT_EQ(chunk_replica(in, 1, 2), 1u);
  EXPECT_EQ(pairs_to_ranks(in, 0), (std::vector<std::uint64_t>{2, 2, 0, 0}));
  EXPECT_EQ(pairs_to_ranks(in, 2), (std::vector<std::uint64_t>{0, 0, 3, 3}));
  const DispatchPlan plan = plan_dispatch(in, x.data(), H);
  for (int shard_rank : {0, 1}) {
    EXPECT_EQ(plan.hop2[shard_rank].rows(), 2u) << "rank " << shard_rank;
    EXPECT_EQ(plan.hop2[shard_rank].experts, (std::vector<std::uint32_t>{1, 1}));
  }
  EXPECT_EQ(plan.hop2[2].rows() + plan.hop2[3].rows(), 0u) << "no row crosses";
  // Schedules: copy 0's shards compute chunk 0 (2 rows of home 0), copy 1's chunks 1 and 2 (3 of home 2).
  for (int r = 0; r < 4; ++r) {
    in.rank = r;
    const ChunkSchedule s = schedule_chunks(in, false);
    const std::size_t slot = std::size_t(std::find(s.experts.begin(), s.experts.end(), 1) - s.experts.begin());
    ASSERT_LT(slot, s.experts.size()) << "rank " << r;
    EXPECT_EQ(s.rows_from[slot], r < 2 ? (std::vector<std::uint32_t>{2, 0, 0, 0})
                                       : (std::vector<std::uint32_t>{0, 0, 3, 0}))
        << "rank " << r;
  }
  // Without islands the copies take chunks in turn: (chunk + step) mod 2.
  in.topology = nullptr;
  in.step = 1;
  EXPECT_EQ(chunk_replica(in, 1, 0), 1u);
  EXPECT_EQ(chunk_replica(in, 1, 1), 0u);
}

}  // namespace
}  // namespace moed::runtime
