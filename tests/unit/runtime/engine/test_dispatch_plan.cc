// The pure middle of a layer's data path (runtime/engine/dispatch_plan.h): counts,
// routes (flat, and hierarchical through gateways), the chunk rule, the row
// and combine wire formats, forwarding at a gateway, the chunk schedule, the
// answers at gateways and homes, and a whole layer simulated in memory over
// 1 to 6 ranks in 1 to 3 islands (its experts run by the ExpertExecutor), which
// must give the same output bits for every placement and either route.
#include "runtime/engine/dispatch_plan.h"
#include "runtime/engine/chunk_schedule.h"
#include "runtime/engine/wire_format.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "common/error.h"
#include "common/rng.h"
#include "kernels/cpu/expert_ffn.h"
#include "kernels/cpu/fixed_combine.h"
#include "placement/placement.h"
#include "placement/topology.h"
#include "runtime/config/config.h"
#include "runtime/engine/expert_executor.h"
#include "runtime/router/router.h"
#include "runtime/weights/expert_store.h"
#include "tests/unit/test_support.h"

namespace moed::runtime {
namespace {

using placement::LinkClass;
using placement::Placement;
using placement::Topology;
using test::expect_error;
using Pairs = std::vector<std::pair<std::uint32_t, float>>;

constexpr std::int64_t kOne = std::int64_t(1) << 32;  // 1.0 in fixed point

Routing make_routing(const std::vector<Pairs>& tokens) {
  Routing r;
  for (const auto& t : tokens) {
    for (auto [e, w] : t) r.add(e, w);
    r.end_token();
  }
  return r;
}

ExpertCounts counts_of(const std::vector<std::vector<std::uint32_t>>& rows) {
  ExpertCounts c(int(rows.size()), int(rows.front().size()));
  for (std::size_t r = 0; r < rows.size(); ++r)
    std::memcpy(c.data() + r * rows[r].size(), rows[r].data(), rows[r].size() * sizeof(std::uint32_t));
  return c;
}

// Rows of `tokens` tokens, element i of token t being 100 t + i: each row recognisable.
std::vector<float> token_rows(std::size_t tokens, int hidden) {
  std::vector<float> x(tokens * hidden);
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = float(100 * (i / hidden) + i % hidden);
  return x;
}

// Views `batches[s]`, packed, as the messages a rank received from rank s.
struct Received {
  std::vector<std::byte> buffer;
  comm::ExchangeLayout layout;
  ReceivedRows rows;
};
void receive(const std::vector<RowBatch>& batches, int hidden, Received& out) {
  pack_rows(batches, hidden, out.buffer, out.layout);
  out.layout.recv_bytes = out.layout.send_bytes;
  out.layout.recv_offsets = out.layout.send_offsets;
  out.rows = parse_rows(out.buffer.data(), out.layout, hidden);
}

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

PlanInput plan_input(const Routing& r, const Placement& p, const ExpertCounts& c, int rank,
                     std::uint64_t chunk_rows = 1, std::uint64_t step = 0, int layer = 0) {
  return PlanInput{&r, &p, layer, &c, rank, chunk_rows, step};
}

// One RowBatch as expected. Rows of local tokens (origin >= 0) must point at their row of `x`.
struct Want {
  std::vector<std::uint64_t> token;
  std::vector<std::int64_t> origin;
  std::vector<std::uint32_t> pair_offsets;
  std::vector<std::uint32_t> experts;
  std::vector<float> weights;
  std::vector<std::uint32_t> dests;
};

void expect_batch(const RowBatch& b, const Want& want, const float* x = nullptr, int hidden = 0) {
  EXPECT_EQ(b.token, want.token);
  EXPECT_EQ(b.origin, want.origin);
  EXPECT_EQ(b.pair_offsets, want.pair_offsets);
  EXPECT_EQ(b.experts, want.experts);
  EXPECT_EQ(b.weights, want.weights);
  EXPECT_EQ(b.dests, want.dests);
  ASSERT_EQ(b.data.size(), b.rows());
  if (x)
    for (std::size_t r = 0; r < b.rows(); ++r)
      if (b.origin[r] >= 0) {
        EXPECT_EQ(b.data[r], x + b.origin[r] * hidden) << "row " << r;
      }
}

void expect_empty(const std::vector<RowBatch>& batches) {
  for (std::size_t d = 0; d < batches.size(); ++d) EXPECT_EQ(batches[d].rows(), 0u) << "to rank " << d;
}

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

// ---------------------------------------------------------------- row wire format

struct MessageSize {
  std::size_t rows, pairs;
  int hidden;
  std::size_t bytes;
};

class RowMessageBytes : public ::testing::TestWithParam<MessageSize> {};

TEST_P(RowMessageBytes, HeaderAndDataEachPaddedTo16) {
  const auto& m = GetParam();
  EXPECT_EQ(row_message_bytes(m.rows, m.pairs, m.hidden), m.bytes);
  EXPECT_EQ(m.bytes % 16, 0u);
}

// Header: 8 + 12 per row (u64 token, u32 pairs) + 12 per pair (expert, weight, dest).
INSTANTIATE_TEST_SUITE_P(
    Sizes, RowMessageBytes,
    ::testing::Values(MessageSize{0, 0, 5, 16},    // 8 -> 16, no data
                      MessageSize{2, 3, 5, 128},   // 8 + 24 + 36 = 68 -> 80; 40 -> 48
                      MessageSize{1, 1, 4, 48},    // 8 + 12 + 12 = 32; 16
                      MessageSize{3, 3, 1, 96},    // 8 + 36 + 36 = 80; 12 -> 16
                      MessageSize{1, 2, 8, 80}));  // 8 + 12 + 24 = 44 -> 48; 32

// Token rows with awkward bits: signed zeros, a denormal, NaN and infinity payloads.
std::vector<float> odd_rows(std::size_t tokens, int hidden, std::uint64_t seed) {
  CounterRng rng(seed);
  std::vector<float> x(tokens * hidden);
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = std::bit_cast<float>(std::uint32_t(rng.bits(i)));
  x[0] = -0.0f;
  if (x.size() > 2) x[1] = 0x1p-140f, x[2] = std::bit_cast<float>(0x7fc01234u);
  return x;
}

// Packs `batches`, reads them back as if each message had come from the rank it
// was sent to, and checks every field bit for bit, the layout, alignment and padding.
void expect_round_trip(const std::vector<RowBatch>& batches, int H) {
  std::vector<std::byte> buffer(4096, std::byte{0xCD});  // stale bytes that padding must clear
  comm::ExchangeLayout layout;
  pack_rows(batches, H, buffer, layout);
  const std::size_t R = batches.size();
  std::vector<std::size_t> bytes, offsets;
  std::size_t total = 0;
  for (const RowBatch& b : batches) {
    offsets.push_back(total);
    bytes.push_back(b.rows() ? row_message_bytes(b.rows(), b.experts.size(), H) : 0);  // empty: no message
    total += bytes.back();
  }
  EXPECT_EQ(layout.send_bytes, bytes);
  EXPECT_EQ(layout.send_offsets, offsets);
  EXPECT_EQ(buffer.size(), total);

  layout.recv_bytes = layout.send_bytes;
  layout.recv_offsets = layout.send_offsets;
  const ReceivedRows received = parse_rows(buffer.data(), layout, H);
  ASSERT_EQ(received.from.size(), R);
  for (std::size_t d = 0; d < R; ++d) {
    SCOPED_TRACE("message to rank " + std::to_string(d));
    const auto& src = received.from[d];
    const RowBatch& b = batches[d];
    ASSERT_EQ(src.rows, b.rows());
    ASSERT_EQ(src.pairs, b.experts.size());
    for (std::uint32_t row = 0; row < src.rows; ++row) {
      EXPECT_EQ(src.token[row], b.token[row]);
      EXPECT_EQ(src.pairs_per_row[row], b.pairs_of(row));
      EXPECT_EQ(src.first_pair[row], b.pair_offsets[row]);
      EXPECT_EQ(std::memcmp(src.data + std::size_t(row) * H, b.data[row], H * sizeof(float)), 0)
          << "row " << row;
    }
    for (std::uint32_t i = 0; i < src.pairs; ++i) {
      EXPECT_EQ(src.experts[i], b.experts[i]);
      EXPECT_EQ(std::bit_cast<std::uint32_t>(src.weights[i]), std::bit_cast<std::uint32_t>(b.weights[i]));
      EXPECT_EQ(src.dests[i], b.dests[i]);
    }
    if (src.rows == 0) continue;
    // Every message starts 16-byte aligned in the buffer, the u64 token ids at offset 8.
    const std::byte* start = buffer.data() + layout.send_offsets[d];
    EXPECT_EQ(layout.send_offsets[d] % 16, 0u);
    EXPECT_EQ(reinterpret_cast<const std::byte*>(src.token) - start, 8);
    EXPECT_EQ(reinterpret_cast<std::uintptr_t>(src.token) % alignof(std::uint64_t), 0u);
    // The header ends after the dests; zero padding up to the data, at a multiple of 16.
    const std::size_t meta = 8 + 12 * std::size_t(src.rows) + 12 * std::size_t(src.pairs);
    EXPECT_EQ(reinterpret_cast<const std::byte*>(src.dests + src.pairs) - start, std::ptrdiff_t(meta));
    const std::size_t data_at = std::size_t(reinterpret_cast<const std::byte*>(src.data) - start);
    EXPECT_EQ(data_at, (meta + 15) / 16 * 16);
    for (std::size_t i = meta; i < data_at; ++i)
      EXPECT_EQ(start[i], std::byte{0}) << "header padding byte " << i;
    for (std::size_t i = data_at + std::size_t(src.rows) * H * 4; i < layout.send_bytes[d]; ++i)
      EXPECT_EQ(start[i], std::byte{0}) << "data padding byte " << i;
  }
}

TEST(RowWire, PackThenParseGivesTheHop2PlanBack) {
  const int H = 5;
  const Placement p = placement::contiguous(3, 1, 6);  // experts 0-1, 2-3, 4-5
  const Routing r = make_routing({{{0, .6f}, {1, .4f}},
                                  {{2, .7f}, {0, .3f}},
                                  {{3, .55f}, {2, .45f}},
                                  {{1, .9f}, {3, .1f}}});
  const ExpertCounts c = counts_of({ExpertCounts::local(r, 6), std::vector<std::uint32_t>(6, 0),
                                    std::vector<std::uint32_t>(6, 0)});
  PlanInput in = plan_input(r, p, c, 0);
  in.first_token = (std::uint64_t(1) << 40) + 3;  // token ids need all 64 bits
  const std::vector<float> x = odd_rows(4, H, 3);
  const DispatchPlan plan = plan_dispatch(in, x.data(), H);
  // rank 0: 3 rows, 4 pairs; rank 1: 3 rows, 4 pairs; rank 2: none (an empty 16-byte message).
  ASSERT_EQ(plan.hop2[0].rows(), 3u);
  ASSERT_EQ(plan.hop2[1].experts.size(), 4u);
  ASSERT_EQ(plan.hop2[2].rows(), 0u);
  expect_round_trip(plan.hop2, H);
}

TEST(RowWire, PackThenParseGivesTheHop1PlanBack) {
  // The hop-1 message carries the dests of remote pairs: token 0's pairs go to ranks 2 and 3.
  const int H = 3;
  Placement p(4, 1, 4);
  for (int e = 0; e < 4; ++e) p.set_replicas(0, e, {e});
  const Routing r = make_routing({{{2, .5f}, {3, .5f}}, {{3, 1}}, {{0, 1}}});
  const ExpertCounts c = counts_of({{0, 0, 0, 0}, {0, 0, 0, 0}, {0, 0, 0, 0}, {0, 0, 0, 0}});
  const Topology t = Topology::blocks(4, 2);
  PlanInput in = plan_input(r, p, c, 0);
  in.topology = &t;
  in.hierarchical = true;
  in.first_token = ~std::uint64_t(0) - 10;
  const std::vector<float> x = odd_rows(3, H, 8);
  const DispatchPlan plan = plan_dispatch(in, x.data(), H);
  ASSERT_EQ(plan.hop1[2].dests, (std::vector<std::uint32_t>{2, 3, 3}));
  expect_round_trip(plan.hop1, H);
}

class RowWireErrors : public ::testing::Test {
 protected:
  void SetUp() override {
    const Placement p = placement::contiguous(1, 1, 2);
    r = make_routing({{{0, .5f}, {1, .5f}}, {{1, 1}}});
    c = counts_of({ExpertCounts::local(r, 2)});
    x.assign(2 * H, 1.0f);
    plan = plan_dispatch(plan_input(r, p, c, 0), x.data(), H);
    pack_rows(plan.hop2, H, buffer, layout);
    layout.recv_bytes = layout.send_bytes;
    layout.recv_offsets = layout.send_offsets;
  }
  // Words: rows, pairs, token ids (2 words each), pairs per row, experts, weights, dests.
  std::uint32_t* words() { return reinterpret_cast<std::uint32_t*>(buffer.data()); }

  static constexpr int H = 4;
  Routing r;
  ExpertCounts c;
  DispatchPlan plan;
  std::vector<float> x;
  std::vector<std::byte> buffer;
  comm::ExchangeLayout layout;
};

TEST_F(RowWireErrors, SizeThatDisagreesWithTheHeader) {
  ASSERT_EQ(words()[0], 2u);  // rows
  ASSERT_EQ(words()[1], 3u);  // pairs
  layout.recv_bytes[0] -= 16;
  expect_error([&] { parse_rows(buffer.data(), layout, H); }, ErrorKind::Internal, {"rank 0", "bytes"});
}

TEST_F(RowWireErrors, TooShortForAHeader) {
  layout.recv_bytes[0] = 4;
  expect_error([&] { parse_rows(buffer.data(), layout, H); }, ErrorKind::Internal, {"rank 0", "4 bytes"});
}

TEST_F(RowWireErrors, PairsPerRowThatDisagreeWithTheHeader) {
  ASSERT_EQ(words()[6], 2u);  // after 2 words of header and 2 u64 token ids
  words()[6] = 1;             // rows now hold 2 pairs, the header says 3
  expect_error([&] { parse_rows(buffer.data(), layout, H); }, ErrorKind::Internal,
               {"rank 0", "2 pairs", "3"});
}

TEST_F(RowWireErrors, RowWithoutPairs) {
  ASSERT_EQ(words()[7], 1u);
  words()[7] = 0;
  expect_error([&] { parse_rows(buffer.data(), layout, H); }, ErrorKind::Internal, {"row 1", "no pair"});
}

TEST_F(RowWireErrors, PackRefusesARowWithoutData) {
  plan.hop2[0].data[1] = nullptr;
  expect_error([&] { pack_rows(plan.hop2, H, buffer, layout); }, ErrorKind::Internal,
               {"row 1", "rank 0", "no data"});
}

// ---------------------------------------------------------------- combine wire format

struct RowBytes {
  std::uint32_t pairs;
  int hidden;
  std::size_t bytes;
};

class CombineRowBytes : public ::testing::TestWithParam<RowBytes> {};

TEST_P(CombineRowBytes, Fp32PaddedTo8ForOnePairHeaderAndFullWidthSumsForMore) {
  EXPECT_EQ(combine_row_bytes(GetParam().pairs, AnswerFormat(GetParam().hidden)), GetParam().bytes);
}

INSTANTIATE_TEST_SUITE_P(Sizes, CombineRowBytes,
                         ::testing::Values(RowBytes{1, 5, 24}, RowBytes{1, 4, 16}, RowBytes{1, 1, 8},
                                           RowBytes{2, 5, 48}, RowBytes{3, 4, 40}, RowBytes{2, 1, 16},
                                           RowBytes{8, 3, 32}));

struct NarrowRowBytes {
  int hidden, width;
  std::size_t bytes;
};

class FixedRowBytes : public ::testing::TestWithParam<NarrowRowBytes> {};

TEST_P(FixedRowBytes, HeaderThenWidthBytesPerSumPaddedTo8) {
  EXPECT_EQ(fixed_row_bytes(GetParam().hidden, GetParam().width), GetParam().bytes);
}

INSTANTIATE_TEST_SUITE_P(Sizes, FixedRowBytes,
                         ::testing::Values(NarrowRowBytes{3, 1, 16}, NarrowRowBytes{8, 1, 16},
                                           NarrowRowBytes{9, 1, 24}, NarrowRowBytes{3, 5, 24},
                                           NarrowRowBytes{2048, 5, 8 + 10240}, NarrowRowBytes{3, 8, 32},
                                           NarrowRowBytes{0, 4, 8}));

// Home rank 0 of two ranks: two rows went to rank 1, global token 20 (local 0) with one
// pair (expert 2, weight 0.25), token 21 (local 1) with two pairs.
std::vector<RowBatch> hand_sent() {
  static const float row[3] = {0, 0, 0};
  std::vector<RowBatch> sent(2);
  sent[1].add(20, 0, row, 2, 0.25f, 1);
  sent[1].add(21, 1, row, 3, 0.5f, 1);
  sent[1].add(21, 1, row, 1, 0.5f, 1);
  return sent;
}

TEST(CombineWire, MessageBytesByPairCountOnBothSides) {
  const int H = 3;
  // An fp32 row (12 bytes, padded to 16) and a fixed-point row at full width (8 + 24).
  EXPECT_EQ(combine_message_bytes(hand_sent(), AnswerFormat(H)), (std::vector<std::size_t>{0, 16 + 32}));
  Received at;  // the same rows as rank 1 received them (here indexed by destination)
  receive(hand_sent(), H, at);
  EXPECT_EQ(combine_message_bytes(at.rows, AnswerFormat(H)), (std::vector<std::size_t>{0, 16 + 32}));
}

// The answers from rank 1 at full width: an fp32 row (3 floats + 4 bytes padding), then a
// fixed-point row (header: 8 bytes per sum; then the sums).
std::vector<std::byte> hand_answers(const float y[3], const std::int64_t partial[3]) {
  std::vector<std::byte> buf(48, std::byte{0xFF});  // padding bytes are garbage on purpose
  const std::uint32_t header[2] = {8, 0};
  std::memcpy(buf.data(), y, 12);
  std::memcpy(buf.data() + 16, header, 8);
  std::memcpy(buf.data() + 24, partial, 24);
  return buf;
}

comm::ExchangeLayout answers_from_rank1(std::size_t bytes) {
  comm::ExchangeLayout layout;
  layout.recv_bytes = {0, bytes};
  layout.recv_offsets = {0, 0};
  return layout;
}

TEST(CombineWire, AccumulateAnswersWeightsAtHomeAndAddsPartials) {
  const int H = 3;
  const float y[3] = {1.0f, -2.0f, 0x1.8p-31f};
  const std::int64_t partial[3] = {5, -7, std::int64_t(1) << 40};
  const std::vector<std::byte> recv = hand_answers(y, partial);
  std::vector<std::int64_t> acc = {1, 2, 3, 4, 5, 6};
  EXPECT_EQ(accumulate_answers(hand_sent(), recv.data(), answers_from_rank1(48), AnswerFormat(H), acc.data(), nullptr), 0u);
  // Local token 0: 0.25 * y * 2^32 = {2^30, -2^31, 0.75 -> rounds to 1}, added to {1, 2, 3}.
  EXPECT_EQ(acc[0], 1 + (std::int64_t(1) << 30));
  EXPECT_EQ(acc[1], 2 - (std::int64_t(1) << 31));
  EXPECT_EQ(acc[2], 3 + 1);
  // Local token 1: the partial as it came.
  EXPECT_EQ(acc[3], 4 + 5);
  EXPECT_EQ(acc[4], 5 - 7);
  EXPECT_EQ(acc[5], 6 + (std::int64_t(1) << 40));
}

TEST(CombineWire, AccumulateAnswersCountsSaturatedTerms) {
  const int H = 3;
  // 0.25 * 4e10 * 2^32 = 4.3e19 > 2^62: saturates at +-2^62.
  const float y[3] = {4e10f, -4e10f, 1.0f};
  const std::int64_t partial[3] = {0, 0, 0};
  const std::vector<std::byte> recv = hand_answers(y, partial);
  std::vector<std::int64_t> acc(6, 0);
  EXPECT_EQ(accumulate_answers(hand_sent(), recv.data(), answers_from_rank1(48), AnswerFormat(H), acc.data(), nullptr), 2u);
  EXPECT_EQ(acc[0], std::int64_t(1) << 62);
  EXPECT_EQ(acc[1], -(std::int64_t(1) << 62));
  EXPECT_EQ(acc[2], std::int64_t(1) << 30);
}

TEST(CombineWire, AccumulateAnswersRefusesAWrongSize) {
  const int H = 3;
  const float y[3] = {0, 0, 0};
  const std::int64_t partial[3] = {0, 0, 0};
  std::vector<std::byte> recv = hand_answers(y, partial);
  recv.resize(64);
  std::vector<std::int64_t> acc(6, 0);
  expect_error(
      [&] { accumulate_answers(hand_sent(), recv.data(), answers_from_rank1(56), AnswerFormat(H), acc.data(), nullptr); },
      ErrorKind::Internal, {"rank 1", "56 bytes", "rows take 48"});
}

// Narrowed in place: the fp32 row stays, the sums {5, -7, 100} fit in one byte each
// (header + 3 bytes padded to 8), and the home adds the same integers.
TEST(CombineWire, NarrowedAnswersAddTheSameIntegers) {
  const int H = 3;
  const float y[3] = {1.0f, -2.0f, 0.5f};
  const std::int64_t partial[3] = {5, -7, 100};
  std::vector<std::byte> full = hand_answers(y, partial), narrow = full;
  const std::uint32_t pairs[2] = {1, 2};
  ASSERT_EQ(narrow_answers(narrow.data(), pairs, 2, AnswerFormat(H)), 16u + 16u);
  std::uint32_t header[2];
  std::memcpy(header, narrow.data() + 16, sizeof header);
  EXPECT_EQ(header[0], 1u);
  EXPECT_EQ(header[1], 0u);
  EXPECT_EQ(std::memcmp(narrow.data(), y, 12), 0);
  const std::int8_t bytes[8] = {5, -7, 100, 0, 0, 0, 0, 0};  // padding zeroed
  EXPECT_EQ(std::memcmp(narrow.data() + 24, bytes, 8), 0);
  std::vector<std::int64_t> from_full = {1, 2, 3, 4, 5, 6}, from_narrow = from_full;
  accumulate_answers(hand_sent(), full.data(), answers_from_rank1(48), AnswerFormat(H), from_full.data(), nullptr);
  accumulate_answers(hand_sent(), narrow.data(), answers_from_rank1(32), AnswerFormat(H), from_narrow.data(), nullptr);
  EXPECT_EQ(from_narrow, from_full);
  EXPECT_EQ(from_narrow[3], 4 + 5);
  EXPECT_EQ(from_narrow[4], 5 - 7);
}

// Each row narrows to its own width; rows move to the front of the message.
TEST(CombineWire, EachRowNarrowsToItsOwnWidth) {
  const int H = 2;
  // Rows at full width: fixed {1, -1} (24 bytes, narrowed 16: 1 byte per sum), fp32 (8),
  // fixed {2^40, -3} (24, narrowed 24: 6 bytes), fixed {kFixedNaN, 0} (24, still 24: 8 bytes).
  const std::uint32_t pairs[4] = {2, 1, 3, 2};
  std::vector<std::byte> message(24 + 8 + 24 + 24);
  lay_out_answers(message.data(), pairs, 4, AnswerFormat(H));
  std::byte* row = message.data();
  const std::int64_t sums[3][2] = {{1, -1}, {std::int64_t(1) << 40, -3}, {kernels::kFixedNaN, 0}};
  const float y[2] = {0.25f, -8.0f};
  std::memcpy(fixed_row_sums(row), sums[0], 16);
  std::memcpy(row + 24, y, 8);
  std::memcpy(fixed_row_sums(row + 32), sums[1], 16);
  std::memcpy(fixed_row_sums(row + 56), sums[2], 16);
  const std::size_t bytes = narrow_answers(message.data(), pairs, 4, AnswerFormat(H));
  EXPECT_EQ(bytes, std::size_t(16 + 8 + 24 + 24));
  RowBatch sent;  // the same rows as sent: local tokens 0-3
  const float data[2] = {0, 0};
  sent.add(0, 0, data, 0, 1, 1);
  sent.add(0, 0, data, 1, 1, 1);
  sent.add(1, 1, data, 0, 0.5f, 1);
  for (std::uint32_t e : {0u, 1u, 2u}) sent.add(2, 2, data, e, 1, 1);
  sent.add(3, 3, data, 0, 1, 1);
  sent.add(3, 3, data, 1, 1, 1);
  std::vector<std::int64_t> acc(8, 10);
  EXPECT_EQ(accumulate_answer_block(sent, message.data(), bytes, AnswerFormat(H), acc.data(), nullptr, 1), 0u);
  EXPECT_EQ(acc, (std::vector<std::int64_t>{11, 9, 10 + (std::int64_t(1) << 29), 10 - (std::int64_t(1) << 34),
                                            10 + (std::int64_t(1) << 40), 7, kernels::kFixedNaN, 10}));
}

class AnswerHeaderErrors : public ::testing::TestWithParam<std::pair<std::uint32_t, std::uint32_t>> {};

// A fixed-point row whose header is not (1-8 bytes per sum, 0) is refused, naming the row.
TEST_P(AnswerHeaderErrors, AreRefusedNamingTheRow) {
  const int H = 3;
  const float y[3] = {0, 0, 0};
  const std::int64_t partial[3] = {0, 0, 0};
  std::vector<std::byte> recv = hand_answers(y, partial);
  const std::uint32_t header[2] = {GetParam().first, GetParam().second};
  std::memcpy(recv.data() + 16, header, sizeof header);
  std::vector<std::int64_t> acc(6, 0);
  expect_error(
      [&] { accumulate_answers(hand_sent(), recv.data(), answers_from_rank1(48), AnswerFormat(H), acc.data(), nullptr); },
      ErrorKind::Internal, {"rank 1", "row 1", "no valid header"});
}

INSTANTIATE_TEST_SUITE_P(Headers, AnswerHeaderErrors,
                         ::testing::Values(std::pair{0u, 0u}, std::pair{9u, 0u}, std::pair{8u, 1u},
                                           std::pair{0xFFFFFFFFu, 0u}));

TEST(CombineWire, ARowPastTheMessageIsRefused) {
  const int H = 3;
  const float y[3] = {0, 0, 0};
  const std::int64_t partial[3] = {0, 0, 0};
  const std::vector<std::byte> recv = hand_answers(y, partial);
  std::vector<std::int64_t> acc(6, 0);
  // The header says 8 bytes per sum, 32 for the row; 24 of them came.
  expect_error(
      [&] { accumulate_answers(hand_sent(), recv.data(), answers_from_rank1(40), AnswerFormat(H), acc.data(), nullptr); },
      ErrorKind::Internal, {"rank 1", "row 1", "ends at byte 48", "40"});
  // Not even the header.
  expect_error(
      [&] { accumulate_answers(hand_sent(), recv.data(), answers_from_rank1(20), AnswerFormat(H), acc.data(), nullptr); },
      ErrorKind::Internal, {"rank 1", "row 1", "no valid header"});
}

// ---------------------------------------------------------------- at a gateway

// Islands {0, 1, 2} and {3, 4}: rank 3 is the gateway of island 1 for homes 0 and 2
// (index 0 and 2 in their island, modulo 2: index 0 of {3, 4}). Experts 5 and 8 are on
// rank 3, 6 and 7 on rank 4. Rank 3 receives the hop-1 rows
//   from home 0: token 10: (expert 5, .75, rank 3), (7, .25, rank 4)         gateway slot 0
//                token 11: (6, .5, rank 4)                                   slot 1
//   from home 2: token 30: (8, .5, rank 3), (5, .25, rank 3), (6, .25, rank 4)  slot 2
// and has one token of its own, global 40, with (5, 1, rank 3).
class AtTheGateway : public ::testing::Test {
 protected:
  static constexpr int H = 3;
  void SetUp() override {
    home0.resize(5);
    home2.resize(5);
    home0[3].add(10, 0, x0.data(), 5, .75f, 3);
    home0[3].add(10, 0, x0.data(), 7, .25f, 4);
    home0[3].add(11, 1, x0.data() + H, 6, .5f, 4);
    home2[3].add(30, 0, x2.data(), 8, .5f, 3);
    home2[3].add(30, 0, x2.data(), 5, .25f, 3);
    home2[3].add(30, 0, x2.data(), 6, .25f, 4);
    std::vector<RowBatch> at3(5);  // what rank 3 receives in hop 1, by source
    at3[0] = home0[3];
    at3[2] = home2[3];
    receive(at3, H, hop1);
    plan.hop2.resize(5);
    plan.hop2[3].add(40, 0, own.data(), 5, 1, 3);
    plan_forward(hop1.rows, H, plan);
  }

  // The island's answers to rank 3's hop-2 rows, as ExpertExecutor writes them:
  //   rank 3 (itself): token 40 fp32 y_own, token 10 fp32 y_a, token 30 fixed-point partial;
  //   rank 4:          token 10 fp32 y_b, token 11 fp32 y_c, token 30 fp32 y_d.
  // Padding bytes are garbage on purpose.
  void answer_island() {
    answers.assign(64 + 48, std::byte{0xFF});
    auto put = [&](std::size_t at, const void* p, std::size_t n) { std::memcpy(answers.data() + at, p, n); };
    const std::uint32_t full_width[2] = {8, 0};
    put(0, y_own, 12);
    put(16, y_a, 12);
    put(32, full_width, 8);  // fixed point: 2 pairs
    put(40, partial, 24);
    put(64, y_b, 12);
    put(80, y_c, 12);
    put(96, y_d, 12);
    layout.recv_bytes = {0, 0, 0, 64, 48};
    layout.recv_offsets = {0, 0, 0, 0, 64};
  }

  const Topology topology{{0, 0, 0, 1, 1}};
  const std::vector<float> x0 = token_rows(2, H), x2 = token_rows(1, H), own = token_rows(1, H);
  std::vector<RowBatch> home0, home2;  // the homes' hop 1
  Received hop1;
  DispatchPlan plan;  // rank 3's

  const float y_own[3] = {1, 2, 3};
  const float y_a[3] = {1, -2, 0.5f};
  const float y_b[3] = {4, 0.5f, -1};
  const float y_c[3] = {0x1.8p-30f, -0.0f, -3};
  const float y_d[3] = {8, -4, 0.25f};
  const std::int64_t partial[3] = {5, -7, std::int64_t(1) << 40};
  std::vector<std::byte> answers;
  comm::ExchangeLayout layout;
};

TEST_F(AtTheGateway, IsTheGatewayOfBothHomes) {
  EXPECT_EQ(gateway(topology, 0, 1), 3);
  EXPECT_EQ(gateway(topology, 2, 1), 3);
  EXPECT_EQ(gateway(topology, 1, 1), 4);
}

TEST_F(AtTheGateway, PlanForwardMakesHop2RowsToTheDestsOfEachHop1Row) {
  const auto& from0 = hop1.rows.from[0];
  const auto& from2 = hop1.rows.from[2];
  // To itself: its own row first, then token 10's pair for rank 3 (slot 0, origin -1) and
  // token 30's two pairs for rank 3 as one row (slot 2, origin -3).
  expect_batch(plan.hop2[3], {.token = {40, 10, 30},
                              .origin = {0, -1, -3},
                              .pair_offsets = {0, 1, 2, 4},
                              .experts = {5, 5, 8, 5},
                              .weights = {1, .75f, .5f, .25f},
                              .dests = {3, 3, 3, 3}});
  EXPECT_EQ(plan.hop2[3].data, (std::vector<const float*>{own.data(), from0.data, from2.data}));
  // To rank 4: slots 0, 1 (home 0's rows 0, 1) and 2 (home 2's row 0).
  expect_batch(plan.hop2[4], {.token = {10, 11, 30},
                              .origin = {-1, -2, -3},
                              .pair_offsets = {0, 1, 2, 3},
                              .experts = {7, 6, 6},
                              .weights = {.25f, .5f, .25f},
                              .dests = {4, 4, 4}});
  EXPECT_EQ(plan.hop2[4].data, (std::vector<const float*>{from0.data, from0.data + H, from2.data}));
  // The data pointers point into the received message, which holds the homes' rows.
  EXPECT_EQ(std::memcmp(plan.hop2[4].data[1], x0.data() + H, H * sizeof(float)), 0);
  for (int d = 0; d < 3; ++d) EXPECT_EQ(plan.hop2[d].rows(), 0u) << "rank " << d;
  EXPECT_TRUE(plan.hop1.empty());  // forwarding adds to hop 2 only
}

TEST_F(AtTheGateway, PlanForwardRefusesADestOutsideThePlan) {
  DispatchPlan small;
  small.hop2.resize(4);  // rank 4 does not exist here
  expect_error([&] { plan_forward(hop1.rows, H, small); }, ErrorKind::Internal, {"hop-1 row for rank 4"});
}

TEST_F(AtTheGateway, PreparesOneSlotPerHop1RowInReceivedOrder) {
  const GatewayAnswers g = prepare_gateway_answers(hop1.rows, AnswerFormat(H));
  // Slot 0: 2 pairs, fixed point (8 + 24); slot 1: 1 pair, fp32 (16); slot 2: 3 pairs (32).
  EXPECT_EQ(g.layout.send_bytes, (std::vector<std::size_t>{48, 0, 32, 0, 0}));
  EXPECT_EQ(g.layout.send_offsets, (std::vector<std::size_t>{0, 48, 48, 80, 80}));
  EXPECT_EQ(g.slot_offset, (std::vector<std::size_t>{0, 32, 48}));
  EXPECT_EQ(g.slot_pairs, (std::vector<std::uint32_t>{2, 1, 3}));
  EXPECT_EQ(g.first_slot, (std::vector<std::size_t>{0, 2, 2, 3, 3, 3}));
  ASSERT_EQ(g.send.size(), 80u);
  for (std::size_t i = 0; i < g.send.size(); ++i)  // full-width headers; sums start at 0
    EXPECT_EQ(g.send[i], std::byte(i == 0 || i == 48 ? 8 : 0)) << "byte " << i;
}

TEST_F(AtTheGateway, SumsItsIslandsAnswersExactly) {
  answer_island();
  ASSERT_EQ(combine_message_bytes(plan.hop2, AnswerFormat(H)), layout.recv_bytes);
  GatewayAnswers g = prepare_gateway_answers(hop1.rows, AnswerFormat(H));
  std::vector<std::int64_t> acc(H, 0);  // rank 3's own token
  EXPECT_EQ(accumulate_answers(plan.hop2, answers.data(), layout, AnswerFormat(H), acc.data(), &g), 0u);
  // The local token's answer goes to acc, weighted at home: 1 * y_own.
  EXPECT_EQ(acc, (std::vector<std::int64_t>{kOne, 2 * kOne, 3 * kOne}));
  // Slot 0 (2 pairs, answered in fp32 by ranks 3 and 4), weighted here:
  //   .75 * {1, -2, .5} * 2^32 = {3 2^30, -12 2^29, 3 2^29}
  //   .25 * {4, .5, -1} * 2^32 = {4 2^30,      2^29, -2 2^29}
  std::int64_t slot[3];
  std::memcpy(slot, fixed_row_sums(g.send.data() + g.slot_offset[0]), sizeof slot);
  EXPECT_EQ(slot[0], 7 * (std::int64_t(1) << 30));
  EXPECT_EQ(slot[1], -11 * (std::int64_t(1) << 29));
  EXPECT_EQ(slot[2], std::int64_t(1) << 29);
  // Slot 1 (a 1-pair hop-1 row): rank 4's fp32 answer, unchanged bits, padding still 0.
  EXPECT_EQ(std::memcmp(g.send.data() + g.slot_offset[1], y_c, sizeof y_c), 0);
  for (std::size_t i = 12; i < 16; ++i) EXPECT_EQ(g.send[g.slot_offset[1] + i], std::byte{0});
  // Slot 2 (3 pairs): rank 3's int64 partial plus rank 4's .25 * {8, -4, .25} * 2^32.
  std::memcpy(slot, fixed_row_sums(g.send.data() + g.slot_offset[2]), sizeof slot);
  EXPECT_EQ(slot[0], 5 + (std::int64_t(1) << 33));
  EXPECT_EQ(slot[1], -7 - kOne);
  EXPECT_EQ(slot[2], (std::int64_t(1) << 40) + (std::int64_t(1) << 28));
}

TEST_F(AtTheGateway, HomesAddTheGatewaysAnswers) {
 for (const bool narrow : {false, true}) {
  SCOPED_TRACE(narrow ? "narrowed" : "full width");
  answer_island();
  GatewayAnswers g = prepare_gateway_answers(hop1.rows, AnswerFormat(H));
  std::vector<std::int64_t> acc3(H, 0);
  accumulate_answers(plan.hop2, answers.data(), layout, AnswerFormat(H), acc3.data(), &g);
  if (narrow) {
    narrow_gateway_answers(g, AnswerFormat(H));
    // Slot 0's sums need 5 bytes (8 + 15, padded: 24), slot 2's 6 (8 + 18: 32).
    EXPECT_EQ(g.layout.send_bytes, (std::vector<std::size_t>{24 + 16, 0, 32, 0, 0}));
  } else {
    EXPECT_EQ(combine_message_bytes(home0, AnswerFormat(H))[3], g.layout.send_bytes[0]);
  }
  // Home 0 receives block 0 of the gateway's hop-1 answers (from rank 3).
  comm::ExchangeLayout back0;
  back0.recv_bytes = {0, 0, 0, g.layout.send_bytes[0], 0};
  back0.recv_offsets = {0, 0, 0, 0, g.layout.send_bytes[0]};
  std::vector<std::int64_t> acc0(2 * H, 0);
  const std::byte* block0 = g.send.data() + g.layout.send_offsets[0];
  EXPECT_EQ(accumulate_answers(home0, block0, back0, AnswerFormat(H), acc0.data(), nullptr), 0u);
  // Token 10: slot 0's sum; token 11: weighted at home, .5 * {1.5 2^-30, -0, -3} * 2^32.
  EXPECT_EQ(acc0, (std::vector<std::int64_t>{7 * (std::int64_t(1) << 30), -11 * (std::int64_t(1) << 29),
                                             std::int64_t(1) << 29, 3, 0, -3 * (std::int64_t(1) << 31)}));
  // Home 2 receives block 2: token 30 gets slot 2's sum.
  comm::ExchangeLayout back2;
  back2.recv_bytes = {0, 0, 0, g.layout.send_bytes[2], 0};
  back2.recv_offsets = {0, 0, 0, 0, g.layout.send_bytes[2]};
  std::vector<std::int64_t> acc2(H, 0);
  const std::byte* block2 = g.send.data() + g.layout.send_offsets[2];
  EXPECT_EQ(accumulate_answers(home2, block2, back2, AnswerFormat(H), acc2.data(), nullptr), 0u);
  EXPECT_EQ(acc2, (std::vector<std::int64_t>{5 + (std::int64_t(1) << 33), -7 - kOne,
                                             (std::int64_t(1) << 40) + (std::int64_t(1) << 28)}));
 }
}

TEST_F(AtTheGateway, AnAnswerForASlotNeedsTheGatewaysAnswers) {
  answer_island();
  std::vector<std::int64_t> acc(H, 0);
  expect_error([&] { accumulate_answers(plan.hop2, answers.data(), layout, AnswerFormat(H), acc.data(), nullptr); },
               ErrorKind::Internal, {"gateway slot", "forwarded nothing"});
}

// ---------------------------------------------------------------- chunk schedule

// Expert 0 has replicas on ranks 0 and 1, chunks of 2 rows. Rank 0 has 3 of its rows
// (positions 0-2), rank 1 has 2 (positions 3-4). Step 0, no topology: chunk j goes to
// replica j mod 2, so chunks 0 ([0, 2)) and 2 ([4, 5)) are rank 0's, chunk 1 ([2, 4))
// rank 1's, whose rows come from both homes.
struct TwoReplicas : ::testing::Test {
  TwoReplicas() : p(2, 1, 2) {
    p.set_replicas(0, 0, {0, 1});
    p.set_replicas(0, 1, {1});
  }
  PlanInput as(int rank) const { return plan_input(none, p, c, rank, 2, 0); }
  Placement p;
  const ExpertCounts c = counts_of({{3, 1}, {2, 0}});
  const Routing none;
};

TEST_F(TwoReplicas, PairsToRanksFollowTheChunks) {
  EXPECT_EQ(pairs_to_ranks(as(0), 0), (std::vector<std::uint64_t>{2, 1 + 1}));  // e1 is on rank 1
  EXPECT_EQ(pairs_to_ranks(as(0), 1), (std::vector<std::uint64_t>{1, 1}));
}

TEST_F(TwoReplicas, WholeChunksNameTheirRowsPerHome) {
  const ChunkSchedule at0 = schedule_chunks(as(0), false);
  ASSERT_EQ(at0.experts, (std::vector<int>{0}));
  EXPECT_EQ(at0.rows_from, (std::vector<std::vector<std::uint32_t>>{{2, 1}}));
  ASSERT_EQ(at0.tasks.size(), 2u);
  EXPECT_EQ(at0.tasks[0].rows, 2u);
  ASSERT_EQ(at0.tasks[0].segments.size(), 1u);
  EXPECT_EQ((std::tuple{at0.tasks[0].segments[0].home, at0.tasks[0].segments[0].first,
                        at0.tasks[0].segments[0].rows}),
            (std::tuple{0, 0u, 2u}));
  ASSERT_EQ(at0.tasks[1].segments.size(), 1u);  // position 4: the first row rank 1 sends here
  EXPECT_EQ((std::tuple{at0.tasks[1].segments[0].home, at0.tasks[1].segments[0].first,
                        at0.tasks[1].segments[0].rows}),
            (std::tuple{1, 0u, 1u}));

  const ChunkSchedule at1 = schedule_chunks(as(1), false);
  ASSERT_EQ(at1.experts, (std::vector<int>{0, 1}));
  EXPECT_EQ(at1.rows_from, (std::vector<std::vector<std::uint32_t>>{{1, 1}, {1, 0}}));
  ASSERT_EQ(at1.tasks.size(), 2u);
  EXPECT_EQ(at1.tasks[0].rows, 2u);  // chunk 1: one row of each home, in one call
  ASSERT_EQ(at1.tasks[0].segments.size(), 2u);
  EXPECT_EQ(at1.tasks[0].segments[0].home, 0);
  EXPECT_EQ(at1.tasks[0].segments[1].home, 1);
  EXPECT_EQ(at1.tasks[1].slot, 1);
}

TEST_F(TwoReplicas, SplitByHomeCutsAChunkAtHomeBoundaries) {
  const ChunkSchedule at1 = schedule_chunks(as(1), true);
  ASSERT_EQ(at1.tasks.size(), 3u);
  for (const ExpertTask& t : at1.tasks) ASSERT_EQ(t.segments.size(), 1u);
  EXPECT_EQ((std::tuple{at1.tasks[0].slot, at1.tasks[0].segments[0].home, at1.tasks[0].rows}),
            (std::tuple{0, 0, 1u}));
  EXPECT_EQ((std::tuple{at1.tasks[1].slot, at1.tasks[1].segments[0].home, at1.tasks[1].rows}),
            (std::tuple{0, 1, 1u}));
  EXPECT_EQ(at1.tasks[2].slot, 1);
}

// ---------------------------------------------------------------- a layer in memory

// A received pair: the message's source, its row and its pair.
struct ExpertRowRef {
  std::uint32_t source, row, pair;
};

// One exchange of a layer (hop 1 or hop 2), both ways, on one rank.
struct Hop {
  std::vector<std::byte> send, recv, back_send, back_recv;
  comm::ExchangeLayout out, back;
  ReceivedRows received;
};

// One rank's side of one layer.
struct RankSide {
  std::size_t start = 0;    // index of its token 0 among the global tokens
  std::uint64_t first = 0;  // global id of its token 0
  std::size_t count = 0;
  Routing routing;
  std::vector<float> x;     // its tokens' rows
  DispatchPlan plan;
  Hop hop1, hop2;
  ChunkSchedule schedule;
  // [slot][home]: the pairs received for that expert from that home, in arrival order.
  std::vector<std::vector<std::vector<ExpertRowRef>>> rows;
  GatewayAnswers gateway;
  std::vector<std::int64_t> acc;
};

// What went over each link class: rows per hop, bytes each way (an empty batch is no
// message, as in the engine).
struct Traffic {
  std::size_t rows[2][placement::kLinkClasses] = {};  // [hop 1, hop 2][link class]
  std::size_t dispatch_bytes[placement::kLinkClasses] = {};
  std::size_t combine_bytes[placement::kLinkClasses] = {};
};
constexpr int kSameRank = int(LinkClass::SameRank), kSameIsland = int(LinkClass::SameIsland),
              kCross = int(LinkClass::CrossIsland);

struct LayerRun {
  int ranks;
  int layer;
  int hidden;
  std::uint64_t chunk_rows, step;
  const Placement* placement;
  const Topology* topology;
  bool hierarchical;
  ExpertCounts counts;
  std::vector<RankSide> side;
  Traffic traffic;

  // As the engine: two hops when hierarchical and there is more than one island.
  bool two_hops() const { return hierarchical && topology->islands() > 1; }
  PlanInput input(int r) const {
    return PlanInput{&side[r].routing, placement, layer, &counts, r, chunk_rows, step,
                     topology, hierarchical, side[r].first};
  }
};

// An all-to-all-v in memory over `hop` (dispatch, or its answers when `back`): block d of
// rank s's send lands in rank d's receive buffer, blocks in source order. Fills the receive
// halves of the layouts and counts the bytes by link class.
void all_to_all(LayerRun& run, Hop RankSide::*hop, bool back) {
  const std::size_t R = run.side.size();
  auto send = [&](std::size_t r) -> const std::vector<std::byte>& {
    return back ? (run.side[r].*hop).back_send : (run.side[r].*hop).send;
  };
  auto layout = [&](std::size_t r) -> comm::ExchangeLayout& {
    return back ? (run.side[r].*hop).back : (run.side[r].*hop).out;
  };
  std::size_t* bytes = back ? run.traffic.combine_bytes : run.traffic.dispatch_bytes;
  for (std::size_t d = 0; d < R; ++d) {
    comm::ExchangeLayout& in = layout(d);
    in.recv_bytes.assign(R, 0);
    for (std::size_t s = 0; s < R; ++s) {
      in.recv_bytes[s] = layout(s).send_bytes[d];
      bytes[int(run.topology->link(int(s), int(d)))] += in.recv_bytes[s];
    }
    in.recv_offsets = comm::ExchangeLayout::prefix_offsets(in.recv_bytes);
    std::vector<std::byte>& recv = back ? (run.side[d].*hop).back_recv : (run.side[d].*hop).recv;
    recv.assign(in.recv_total(), std::byte{0});
    for (std::size_t s = 0; s < R; ++s)
      if (in.recv_bytes[s])
        std::memcpy(recv.data() + in.recv_offsets[s], send(s).data() + layout(s).send_offsets[d],
                    in.recv_bytes[s]);
  }
}

void count_rows(LayerRun& run, std::vector<RowBatch> DispatchPlan::*hop, int which) {
  for (int s = 0; s < run.ranks; ++s)
    for (int d = 0; d < run.ranks; ++d)
      run.traffic.rows[which][int(run.topology->link(s, d))] += (run.side[s].plan.*hop)[d].rows();
}

// Global tokens: rows and routing. The routing of a token is its own: the same whatever
// rank it sits on.
struct Tokens {
  std::size_t count;
  int hidden, experts;
  std::vector<float> x;
  Routing routing;
};

Tokens make_tokens(std::size_t n, int hidden, int experts, int top_k, std::uint64_t seed) {
  Tokens t{n, hidden, experts, {}, {}};
  CounterRng rng(seed);
  t.x.resize(n * hidden);
  for (std::size_t i = 0; i < t.x.size(); ++i) t.x[i] = 2.0f * rng.normalish(i);
  CounterRng lrng(seed + 1);
  std::vector<float> logits(n * experts);
  for (std::size_t i = 0; i < logits.size(); ++i) logits[i] = 2.0f * lrng.normalish(i);
  RouterParams p;
  p.top_k = top_k;
  route(logits.data(), n, experts, p, t.routing);
  return t;
}

// The home rank of a token key.
int home_of(const LayerRun& run, std::uint64_t key) {
  for (int h = 0; h < run.ranks; ++h)
    if (key >= run.side[h].first && key < run.side[h].first + run.side[h].count) return h;
  ADD_FAILURE() << "token " << key << " has no home";
  return 0;
}

// As LayerPass does: the schedule from the counts, then each received pair filed under
// its expert and home in arrival order; what arrived must be what the schedule expects.
void file_rows_by_home(LayerRun& run, int r, bool split_by_home) {
  RankSide& s = run.side[r];
  s.schedule = schedule_chunks(run.input(r), split_by_home);
  std::vector<int> slot_of(std::size_t(run.counts.experts()), -1);
  for (std::size_t i = 0; i < s.schedule.experts.size(); ++i) slot_of[s.schedule.experts[i]] = int(i);
  s.rows.assign(s.schedule.experts.size(), std::vector<std::vector<ExpertRowRef>>(std::size_t(run.ranks)));
  for (std::uint32_t src = 0; src < s.hop2.received.from.size(); ++src) {
    const auto& f = s.hop2.received.from[src];
    for (std::uint32_t row = 0; row < f.rows; ++row)
      for (std::uint32_t p = f.first_pair[row]; p < f.first_pair[row] + f.pairs_per_row[row]; ++p) {
        ASSERT_GE(slot_of[f.experts[p]], 0) << "rank " << r << " got expert " << f.experts[p];
        s.rows[slot_of[f.experts[p]]][home_of(run, f.token[row])].push_back({src, row, p});
      }
  }
  for (std::size_t slot = 0; slot < s.rows.size(); ++slot)
    for (int h = 0; h < run.ranks; ++h)
      EXPECT_EQ(s.rows[slot][h].size(), s.schedule.rows_from[slot][h])
          << "rank " << r << " expert " << s.schedule.experts[slot] << " home " << h;
  // The tasks, taken in order, give each home's rows in order, once each.
  std::vector<std::vector<std::uint32_t>> next(s.rows.size(), std::vector<std::uint32_t>(std::size_t(run.ranks), 0));
  for (const ExpertTask& t : s.schedule.tasks) {
    std::uint32_t rows = 0;
    for (const TaskSegment& seg : t.segments) {
      EXPECT_EQ(seg.first, next[t.slot][seg.home]);
      next[t.slot][seg.home] += seg.rows;
      rows += seg.rows;
    }
    EXPECT_EQ(rows, t.rows);
  }
  for (std::size_t slot = 0; slot < s.rows.size(); ++slot)
    EXPECT_EQ(next[slot], s.schedule.rows_from[slot]) << "rank " << r;
}

// Every rank could size its receives from the counts: the pairs each home sent each rank.
void check_pairs_to_ranks(const LayerRun& run) {
  for (int h = 0; h < run.ranks; ++h) {
    std::vector<std::uint64_t> arrived(std::size_t(run.ranks), 0);
    for (int d = 0; d < run.ranks; ++d)
      for (const auto& f : run.side[d].hop2.received.from)
        for (std::uint32_t row = 0; row < f.rows; ++row)
          if (home_of(run, f.token[row]) == h) arrived[d] += f.pairs_per_row[row];
    for (int r = 0; r < run.ranks; ++r)
      EXPECT_EQ(pairs_to_ranks(run.input(r), h), arrived) << "home " << h << " as planned on rank " << r;
  }
}

// Splits the global tokens evenly by rank (as the engine does; global id = step * count +
// index, as the engine's) and runs plan, [pack, exchange, parse and forward hop 1], pack,
// exchange, parse and batch hop 2 on every rank.
LayerRun dispatch_layer(const Tokens& tokens, const Placement& placement, const Topology& topology,
                        bool hierarchical, int layer, std::uint64_t chunk_rows, std::uint64_t step,
                        bool split_by_home = false) {
  const int R = placement.ranks(), H = tokens.hidden, E = tokens.experts;
  EXPECT_EQ(topology.ranks(), R);
  LayerRun run{R, layer, H, chunk_rows, step, &placement, &topology, hierarchical,
               ExpertCounts(R, E), std::vector<RankSide>(R), {}};
  for (int r = 0; r < R; ++r) {
    RankSide& s = run.side[r];
    s.start = tokens.count * r / R;
    s.first = step * tokens.count + s.start;
    s.count = tokens.count * (r + 1) / R - s.start;
    s.x.assign(tokens.x.begin() + s.start * H, tokens.x.begin() + (s.start + s.count) * H);
    for (std::size_t t = 0; t < s.count; ++t) {
      auto e = tokens.routing.experts_of(s.start + t);
      auto w = tokens.routing.weights_of(s.start + t);
      for (std::size_t i = 0; i < e.size(); ++i) s.routing.add(e[i], w[i]);
      s.routing.end_token();
    }
    const std::vector<std::uint32_t> mine = ExpertCounts::local(s.routing, E);
    std::memcpy(run.counts.data() + std::size_t(r) * E, mine.data(), E * sizeof(std::uint32_t));
  }
  for (int r = 0; r < R; ++r) run.side[r].plan = plan_dispatch(run.input(r), run.side[r].x.data(), H);
  if (run.two_hops()) {
    count_rows(run, &DispatchPlan::hop1, 0);
    for (RankSide& s : run.side) pack_rows(s.plan.hop1, H, s.hop1.send, s.hop1.out);
    all_to_all(run, &RankSide::hop1, false);
    for (RankSide& s : run.side) {
      s.hop1.received = parse_rows(s.hop1.recv.data(), s.hop1.out, H);
      plan_forward(s.hop1.received, H, s.plan);
    }
  }
  count_rows(run, &DispatchPlan::hop2, 1);
  for (RankSide& s : run.side) pack_rows(s.plan.hop2, H, s.hop2.send, s.hop2.out);
  all_to_all(run, &RankSide::hop2, false);
  for (int r = 0; r < R; ++r) {
    RankSide& s = run.side[r];
    s.hop2.received = parse_rows(s.hop2.recv.data(), s.hop2.out, H);
    file_rows_by_home(run, r, split_by_home);
  }
  check_pairs_to_ranks(run);
  return run;
}

// Every expert of a model shape in one store, shared by the simulated ranks: an expert's
// weights are the synthetic model's whichever rank holds it.
const ExpertStore& all_experts(int layers, int experts, int hidden) {
  static std::map<std::tuple<int, int, int>, ExpertStore> stores;
  const std::tuple key{layers, experts, hidden};
  auto it = stores.find(key);
  if (it == stores.end()) {
    Config c = default_config();
    c.model.layers = layers;
    c.model.experts = experts;
    c.model.top_k = 1;
    c.model.hidden = hidden;
    c.model.ffn = 5;
    it = stores.emplace(key, ExpertStore::load(c, placement::contiguous(1, layers, experts), 0)).first;
  }
  return it->second;
}

// The hop-2 answers, written by the ExpertExecutor: one answer per received row, task by
// task (fp32 unweighted for a single pair, fixed-point weighted sums otherwise), then
// narrowed when `narrow`.
void run_experts(RankSide& s, const LayerRun& run, bool narrow) {
  const int H = run.hidden;
  const ReceivedRows& received = s.hop2.received;
  comm::ExchangeLayout& layout = s.hop2.back;
  layout.send_bytes = combine_message_bytes(received, AnswerFormat(H));
  layout.send_offsets = comm::ExchangeLayout::prefix_offsets(layout.send_bytes);
  s.hop2.back_send.resize(layout.send_total());
  std::vector<std::vector<std::size_t>> row_at(received.from.size());
  for (std::size_t src = 0; src < received.from.size(); ++src) {
    const ReceivedRows::Source& from = received.from[src];
    lay_out_answers(s.hop2.back_send.data() + layout.send_offsets[src], from.pairs_per_row, from.rows, AnswerFormat(H));
    std::size_t at = layout.send_offsets[src];
    for (std::uint32_t row = 0; row < from.rows; ++row) {
      const bool single = from.pairs_per_row[row] == 1;
      row_at[src].push_back(at + (single ? 0 : kFixedRowHeaderBytes));
      at += combine_row_bytes(from.pairs_per_row[row], AnswerFormat(H));
    }
  }
  const ExpertStore& store = all_experts(run.placement->layers(), run.counts.experts(), H);
  ExpertExecutor executor;
  std::vector<ExpertRow> rows;
  for (const ExpertTask& t : s.schedule.tasks) {
    rows.clear();
    for (const TaskSegment& seg : t.segments)
      for (std::uint32_t k = seg.first; k < seg.first + seg.rows; ++k) {
        const ExpertRowRef& row = s.rows[t.slot][seg.home][k];
        const auto& src = received.from[row.source];
        rows.push_back({src.data + std::size_t(row.row) * H, s.hop2.back_send.data() + row_at[row.source][row.row],
                        src.weights[row.pair], src.pairs_per_row[row.row] == 1});
      }
    EXPECT_EQ(executor.run(store.expert(run.layer, s.schedule.experts[t.slot]), rows).saturated, 0u) << "saturated";
  }
  if (!narrow) return;
  for (std::size_t src = 0; src < received.from.size(); ++src)
    layout.send_bytes[src] = narrow_answers(s.hop2.back_send.data() + layout.send_offsets[src],
                                            received.from[src].pairs_per_row, received.from[src].rows, AnswerFormat(H));
}

// What a sender gets back: its full-width answers' size, or less once narrowed.
void expect_answer_bytes(const std::vector<std::size_t>& got, const std::vector<std::size_t>& full, bool narrow) {
  if (!narrow) {
    EXPECT_EQ(got, full);
    return;
  }
  ASSERT_EQ(got.size(), full.size());
  for (std::size_t i = 0; i < got.size(); ++i) EXPECT_LE(got[i], full[i]) << "from rank " << i;
}

// The whole layer: dispatch, experts, hop-2 answers into homes and gateways,
// [hop-1 answers into homes], residual. Returns the global outputs; `traffic` gets the counts.
// `narrow`: answers travel narrowed, as the engine sends them by default.
std::vector<float> run_layer(const Tokens& tokens, const Placement& placement, const Topology& topology,
                             bool hierarchical, int layer, std::uint64_t chunk_rows, std::uint64_t step,
                             Traffic* traffic = nullptr, bool narrow = true) {
  LayerRun run = dispatch_layer(tokens, placement, topology, hierarchical, layer, chunk_rows, step);
  const int H = tokens.hidden;
  for (RankSide& s : run.side) run_experts(s, run, narrow);
  all_to_all(run, &RankSide::hop2, true);
  for (RankSide& s : run.side) {
    // What a sender expects back agrees with what the experts sent.
    expect_answer_bytes(s.hop2.back.recv_bytes, combine_message_bytes(s.plan.hop2, AnswerFormat(H)), narrow);
    if (run.two_hops()) s.gateway = prepare_gateway_answers(s.hop1.received, AnswerFormat(H));
    s.acc.assign(s.count * H, 0);
    EXPECT_EQ(accumulate_answers(s.plan.hop2, s.hop2.back_recv.data(), s.hop2.back, AnswerFormat(H), s.acc.data(),
                                 run.two_hops() ? &s.gateway : nullptr),
              0u);
  }
  if (run.two_hops()) {
    for (RankSide& s : run.side) {
      if (narrow) narrow_gateway_answers(s.gateway, AnswerFormat(H));
      s.hop1.back_send = s.gateway.send;
      s.hop1.back = s.gateway.layout;
    }
    all_to_all(run, &RankSide::hop1, true);
    for (RankSide& s : run.side) {
      expect_answer_bytes(s.hop1.back.recv_bytes, combine_message_bytes(s.plan.hop1, AnswerFormat(H)), narrow);
      EXPECT_EQ(
          accumulate_answers(s.plan.hop1, s.hop1.back_recv.data(), s.hop1.back, AnswerFormat(H), s.acc.data(), nullptr),
          0u);
    }
  }
  std::vector<float> out(tokens.count * H);
  for (RankSide& s : run.side)
    kernels::residual_from_fixed(s.x.data(), s.acc.data(), s.count * H, out.data() + s.start * H);
  if (traffic) *traffic = run.traffic;
  return out;
}

// The placements and topologies the layer is checked under; layer 1 of 2 is the one served.
struct PlacementCase {
  const char* name;
  std::function<Placement()> make;
  std::vector<int> island_of_rank;
  Topology topology() const { return Topology(island_of_rank); }
};

constexpr int kExperts = 6, kLayers = 2, kLayer = 1;

Placement everywhere_thrice() {
  // 4 ranks, each expert on three of them, replica order rotating.
  Placement p(4, kLayers, kExperts);
  for (int l = 0; l < kLayers; ++l)
    for (int e = 0; e < kExperts; ++e) p.set_replicas(l, e, {e % 4, (e + 1) % 4, (e + 2) % 4});
  return p;
}

const std::vector<PlacementCase>& placement_cases() {
  using placement::add_random_replicas, placement::contiguous, placement::shuffled;
  static const std::vector<PlacementCase> cases = {
      {"OneRank", [] { return contiguous(1, kLayers, kExperts); }, {0}},
      {"ThreeRanksOneIsland", [] { return contiguous(3, kLayers, kExperts); }, {0, 0, 0}},
      {"ThreeRanksShuffledWithReplicas",
       [] { return add_random_replicas(shuffled(3, kLayers, kExperts, 17), 4, 5); }, {0, 0, 1}},
      {"FourRanksTwoIslandsContiguous", [] { return contiguous(4, kLayers, kExperts); }, {0, 0, 1, 1}},
      {"FourRanksTwoIslandsShuffled", [] { return shuffled(4, kLayers, kExperts, 23); }, {0, 0, 1, 1}},
      {"FourRanksTwoIslandsShuffledWithReplicas",
       [] { return add_random_replicas(shuffled(4, kLayers, kExperts, 23), 4, 7); }, {0, 0, 1, 1}},
      {"FourRanksThreeReplicasEach", everywhere_thrice, {0, 0, 1, 1}},
      // Ranks 3 and 4 hold no expert: island 1 only sends.
      {"FiveRanksUnevenIslandsSomeWithoutExperts", [] { return contiguous(5, kLayers, kExperts); },
       {0, 0, 0, 1, 1}},
      {"SixRanksThreeIslandsContiguous", [] { return contiguous(6, kLayers, kExperts); },
       {0, 0, 1, 1, 2, 2}},
      {"SixRanksThreeIslandsShuffled", [] { return shuffled(6, kLayers, kExperts, 29); },
       {0, 0, 1, 1, 2, 2}},
      {"SixRanksThreeIslandsShuffledWithReplicas",
       [] { return add_random_replicas(shuffled(6, kLayers, kExperts, 31), 6, 11); }, {0, 0, 1, 1, 2, 2}},
      {"SixRanksTwoIslandsOfThreeWithReplicas",
       [] { return add_random_replicas(shuffled(6, kLayers, kExperts, 37), 5, 13); }, {0, 0, 0, 1, 1, 1}},
  };
  return cases;
}

bool has_replicas(const Placement& p, int layer) {
  for (int e = 0; e < p.experts(); ++e)
    if (p.replicas(layer, e).size() > 1) return true;
  return false;
}

TEST(PlacementCases, ReplicaCasesReallyHaveReplicas) {
  // Otherwise the replica paths of the layer tests would not be exercised.
  for (const auto& c : placement_cases()) {
    const std::string name = c.name;
    EXPECT_EQ(has_replicas(c.make(), kLayer), name.find("Replica") != std::string::npos) << name;
    EXPECT_NO_THROW(c.make().validate(c.name));
    EXPECT_EQ(c.topology().ranks(), c.make().ranks()) << name;
  }
}

// 37 tokens, top-3 of 6 experts, H = 7 (odd: padded rows), chunks of 3 rows, step 5.
const Tokens& layer_tokens() {
  static const Tokens tokens = make_tokens(37, 7, kExperts, 3, 99);
  return tokens;
}
constexpr std::uint64_t kChunk = 3, kStep = 5;

class LayerInMemory : public ::testing::TestWithParam<std::tuple<std::size_t, bool>> {
 protected:
  const PlacementCase& which() const { return placement_cases()[std::get<0>(GetParam())]; }
  bool hierarchical() const { return std::get<1>(GetParam()); }
  LayerRun dispatch() const {
    return dispatch_layer(tokens, p, topology, hierarchical(), kLayer, kChunk, kStep);
  }
  const Tokens& tokens = layer_tokens();
  const Placement p = which().make();
  const Topology topology = which().topology();
};

std::string case_name(const ::testing::TestParamInfo<std::tuple<std::size_t, bool>>& info) {
  return std::string(placement_cases()[std::get<0>(info.param)].name) +
         (std::get<1>(info.param) ? "Hierarchical" : "Flat");
}

TEST_P(LayerInMemory, CombineSizesAgreeOnBothSides) {
  LayerRun run = dispatch();
  const int H = tokens.hidden;
  for (int r = 0; r < run.ranks; ++r)
    for (int s = 0; s < run.ranks; ++s) {
      EXPECT_EQ(combine_message_bytes(run.side[r].hop2.received, AnswerFormat(H))[s],
                combine_message_bytes(run.side[s].plan.hop2, AnswerFormat(H))[r])
          << "hop 2: rank " << r << " answering rank " << s;
      if (run.two_hops()) {
        EXPECT_EQ(combine_message_bytes(run.side[r].hop1.received, AnswerFormat(H))[s],
                  combine_message_bytes(run.side[s].plan.hop1, AnswerFormat(H))[r])
            << "hop 1: rank " << r << " answering rank " << s;
      }
    }
}

// Where each pair is computed, by the chunk rule: token id -> {(expert, rank)}.
std::map<std::uint64_t, std::set<std::pair<std::uint32_t, int>>> expected_pairs(const LayerRun& run,
                                                                                const Tokens& tokens) {
  std::map<std::uint64_t, std::set<std::pair<std::uint32_t, int>>> want;
  std::vector<std::uint64_t> position(tokens.experts, 0);
  const std::uint64_t base = run.step * tokens.count;
  for (std::size_t t = 0; t < tokens.count; ++t)
    for (std::uint32_t e : tokens.routing.experts_of(t)) {
      const std::uint64_t chunk = position[e]++ / run.chunk_rows;
      const int rank = run.placement->replicas(run.layer, int(e))[chunk_replica(run.input(0), int(e), chunk)];
      want[base + t].emplace(e, rank);
    }
  return want;
}

TEST_P(LayerInMemory, EveryTokenTravelsOnceToEachRankOfItsExperts) {
  LayerRun run = dispatch();
  const auto want = expected_pairs(run, tokens);
  // What arrived in hop 2, from homes and gateways alike: at most one row per (token, rank).
  std::map<std::uint64_t, std::set<std::pair<std::uint32_t, int>>> got;
  std::set<std::pair<std::uint64_t, int>> rows;
  std::size_t pairs = 0;
  for (int d = 0; d < run.ranks; ++d)
    for (const auto& src : run.side[d].hop2.received.from)
      for (std::uint32_t r = 0; r < src.rows; ++r) {
        EXPECT_TRUE(rows.emplace(src.token[r], d).second)
            << "token " << src.token[r] << " twice at rank " << d;
        for (std::uint32_t q = src.first_pair[r]; q < src.first_pair[r] + src.pairs_per_row[r]; ++q) {
          EXPECT_EQ(src.dests[q], std::uint32_t(d));
          got[src.token[r]].emplace(src.experts[q], d);
          ++pairs;
        }
      }
  EXPECT_EQ(got, want);
  EXPECT_EQ(pairs, tokens.routing.pairs());
  // Each home's rows of its own tokens, per destination, are in token order with
  // token = first + origin.
  for (const RankSide& s : run.side)
    for (const auto* hop : {&s.plan.hop1, &s.plan.hop2})
      for (const RowBatch& b : *hop) {
        std::int64_t last = -1;
        for (std::size_t r = 0; r < b.rows(); ++r) {
          if (b.origin[r] < 0) continue;
          EXPECT_GT(b.origin[r], last);
          last = b.origin[r];
          EXPECT_EQ(b.token[r], s.first + std::uint64_t(b.origin[r]));
        }
      }
}

TEST_P(LayerInMemory, RowsGoOnlyWhereTheRouteSays) {
  LayerRun run = dispatch();
  const Topology& t = topology;
  for (int s = 0; s < run.ranks; ++s) {
    const DispatchPlan& plan = run.side[s].plan;
    for (int d = 0; d < run.ranks; ++d) {
      const bool cross = t.island_of(s) != t.island_of(d);
      if (!run.two_hops()) {
        EXPECT_EQ(plan.hop1[d].rows(), 0u) << "flat: no hop 1, rank " << s << " to " << d;
        continue;
      }
      // Hop 1 only to the gateways of remote islands; one row per (token, remote island).
      if (plan.hop1[d].rows()) {
        EXPECT_TRUE(cross && d == gateway(t, s, t.island_of(d))) << "hop 1 from " << s << " to " << d;
      }
      for (std::size_t r = 1; r < plan.hop1[d].rows(); ++r)
        EXPECT_LT(plan.hop1[d].token[r - 1], plan.hop1[d].token[r]);
      // Hop 2 stays inside islands: the home's own rows and the forwarded ones.
      if (cross) {
        EXPECT_EQ(plan.hop2[d].rows(), 0u) << "hop 2 across islands, " << s << " to " << d;
      }
    }
  }
}

TEST_P(LayerInMemory, TasksFollowTheChunkRule) {
  LayerRun run = dispatch();
  const int H = tokens.hidden;
  const std::uint64_t base = kStep * tokens.count;
  bool split = false;  // some expert's rows divided between replicas
  for (int e = 0; e < kExperts; ++e) {
    // Expert e's pairs in global token order, by a plain walk over the global routing.
    std::vector<std::uint64_t> global;
    std::vector<float> weight;
    for (std::size_t t = 0; t < tokens.count; ++t)
      for (std::size_t i = 0; i < tokens.routing.experts_of(t).size(); ++i)
        if (tokens.routing.experts_of(t)[i] == std::uint32_t(e)) {
          global.push_back(t);
          weight.push_back(tokens.routing.weights_of(t)[i]);
        }
    EXPECT_EQ(run.counts.total(e), global.size());
    const std::vector<int>& replicas = p.replicas(kLayer, e);
    for (std::size_t k = 0; k < replicas.size(); ++k) {
      // Chunk j (rows [3j, 3j + 3)) belongs to replica chunk_replica(j) (its rule is
      // checked by hand above); on one island that is (j + step) mod R.
      std::vector<std::uint64_t> want_tokens;
      std::vector<float> want_weights;
      std::vector<std::uint32_t> want_chunks;
      for (std::size_t j = 0; j * kChunk < global.size(); ++j) {
        const std::size_t owner = chunk_replica(run.input(0), e, j);
        if (topology.islands() == 1) {
          EXPECT_EQ(owner, (j + kStep) % replicas.size());
        }
        if (owner != k) continue;
        const std::size_t end = std::min<std::size_t>(global.size(), (j + 1) * kChunk);
        want_chunks.push_back(std::uint32_t(end - j * kChunk));
        for (std::size_t q = j * kChunk; q < end; ++q) {
          want_tokens.push_back(global[q]);
          want_weights.push_back(weight[q]);
        }
      }
      const RankSide& holder = run.side[replicas[k]];
      const auto slot_it = std::find(holder.schedule.experts.begin(), holder.schedule.experts.end(), e);
      ASSERT_NE(slot_it, holder.schedule.experts.end()) << "expert " << e << " is not scheduled on rank " << replicas[k];
      const int slot = int(slot_it - holder.schedule.experts.begin());
      // The expert's rows in task order, and the tasks' sizes (whole chunks here).
      std::vector<ExpertRowRef> rows;
      std::vector<std::uint32_t> chunks;
      for (const ExpertTask& t : holder.schedule.tasks) {
        if (t.slot != slot) continue;
        chunks.push_back(t.rows);
        for (const TaskSegment& seg : t.segments)
          for (std::uint32_t q = seg.first; q < seg.first + seg.rows; ++q) rows.push_back(holder.rows[slot][seg.home][q]);
      }
      EXPECT_EQ(chunks, want_chunks) << "expert " << e << " replica " << k;
      ASSERT_EQ(rows.size(), want_tokens.size()) << "expert " << e << " replica " << k;
      split |= replicas.size() > 1 && !want_tokens.empty() && want_tokens.size() < global.size();
      for (std::size_t i = 0; i < rows.size(); ++i) {
        const ExpertRowRef& row = rows[i];
        const auto& src = holder.hop2.received.from[row.source];
        const std::uint64_t token = src.token[row.row] - base;
        EXPECT_EQ(token, want_tokens[i]) << "expert " << e << " replica " << k << " row " << i;
        EXPECT_EQ(src.experts[row.pair], std::uint32_t(e));
        EXPECT_EQ(src.weights[row.pair], want_weights[i]);
        EXPECT_EQ(std::memcmp(src.data + std::size_t(row.row) * H, tokens.x.data() + token * H,
                              H * sizeof(float)),
                  0);
      }
    }
  }
  if (has_replicas(p, kLayer)) {
    EXPECT_TRUE(split) << "no expert was split between its replicas";
  }
  // Every rank schedules exactly its local experts, ascending.
  for (int r = 0; r < run.ranks; ++r) EXPECT_EQ(run.side[r].schedule.experts, p.experts_on(kLayer, r)) << "rank " << r;
}

TEST_P(LayerInMemory, CountsThatDisagreeWithTheRowsChangeTheSchedule) {
  LayerRun run = dispatch();
  // Claim more pairs of expert 0 than were sent: 2 n more chunks (n replicas) from the last
  // rank, after every row sent. At least 2 n - 1 of them are whole and from the last rank's
  // island, so they rotate among the replicas there (among all when none is there): the
  // holder, one of those, expects rows from the last rank that never came (LayerPass
  // refuses such a layer as an Internal error when the message is filed).
  const int e = 0, last = run.ranks - 1;
  const std::vector<int>& replicas = p.replicas(kLayer, e);
  int holder = replicas[0];
  for (int r : replicas)
    if (topology.island_of(r) == topology.island_of(last)) {
      holder = r;
      break;
    }
  run.counts.data()[std::size_t(last) * kExperts + e] += std::uint32_t(2 * kChunk * replicas.size());
  const ChunkSchedule wrong = schedule_chunks(run.input(holder), false);
  const RankSide& s = run.side[holder];
  const std::size_t slot = std::size_t(
      std::find(s.schedule.experts.begin(), s.schedule.experts.end(), e) - s.schedule.experts.begin());
  EXPECT_GT(wrong.rows_from[slot][last], s.rows[slot][last].size());
}

TEST_P(LayerInMemory, OutputMatchesAPlainSum) {
  const std::vector<float> out = run_layer(tokens, p, topology, hierarchical(), kLayer, kChunk, kStep);
  const int H = tokens.hidden;
  const ExpertStore& store = all_experts(kLayers, kExperts, H);
  std::vector<float> y(H), scratch(kernels::expert_ffn_scratch(store.expert(kLayer, 0), 1));
  for (std::size_t t = 0; t < tokens.count; ++t) {
    std::vector<double> want(tokens.x.begin() + std::ptrdiff_t(t * H), tokens.x.begin() + std::ptrdiff_t((t + 1) * H));
    for (std::size_t k = 0; k < tokens.routing.experts_of(t).size(); ++k) {
      kernels::expert_ffn(store.expert(kLayer, int(tokens.routing.experts_of(t)[k])), tokens.x.data() + t * H, 1,
                          y.data(), scratch.data());
      for (int i = 0; i < H; ++i) want[i] += double(tokens.routing.weights_of(t)[k]) * y[i];
    }
    for (int i = 0; i < H; ++i)
      EXPECT_NEAR(out[t * H + i], want[i], 1e-5 * (1 + std::abs(want[i]))) << "token " << t << " element " << i;
  }
}

TEST_P(LayerInMemory, OutputBitsEqualTheOneRankRun) {
  const PlacementCase& one = placement_cases()[0];
  // At full width; every other case narrows its answers.
  const std::vector<float> reference =
      run_layer(tokens, one.make(), one.topology(), false, kLayer, kChunk, kStep, nullptr, false);
  const std::vector<float> here = run_layer(tokens, p, topology, hierarchical(), kLayer, kChunk, kStep);
  ASSERT_EQ(reference.size(), here.size());
  for (std::size_t i = 0; i < reference.size(); ++i)
    ASSERT_EQ(std::bit_cast<std::uint32_t>(reference[i]), std::bit_cast<std::uint32_t>(here[i]))
        << "token " << i / tokens.hidden << " element " << i % tokens.hidden;
}

INSTANTIATE_TEST_SUITE_P(Placements, LayerInMemory,
                         ::testing::Combine(::testing::Range<std::size_t>(0, placement_cases().size()),
                                            ::testing::Bool()),
                         case_name);

// ---------------------------------------------------------------- traffic by link class

// Flat against hierarchical on the same tokens and placement: the same bits, and one
// cross-island row per (token, remote island) instead of one per (token, remote rank).
class LayerTraffic : public ::testing::TestWithParam<std::size_t> {};

TEST_P(LayerTraffic, HierarchicalCrossesIslandsOncePerTokenAndIsland) {
  const PlacementCase& c = placement_cases()[GetParam()];
  const Placement p = c.make();
  const Topology t = c.topology();
  const Tokens& tokens = layer_tokens();
  Traffic flat, hier;
  const std::vector<float> a = run_layer(tokens, p, t, false, kLayer, kChunk, kStep, &flat);
  const std::vector<float> b = run_layer(tokens, p, t, true, kLayer, kChunk, kStep, &hier);
  ASSERT_EQ(a.size(), b.size());
  EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0);

  // By hand from the chunk rule: the remote ranks and remote islands of each token.
  LayerRun run = dispatch_layer(tokens, p, t, false, kLayer, kChunk, kStep);
  std::size_t remote_ranks = 0, remote_islands = 0;
  for (const auto& [token, pairs] : expected_pairs(run, tokens)) {
    const int home = int(std::upper_bound(run.side.begin(), run.side.end(), token,
                                          [](std::uint64_t id, const RankSide& s) { return id < s.first; }) -
                         run.side.begin()) - 1;
    std::set<int> ranks, islands;
    for (const auto& [e, rank] : pairs)
      if (t.island_of(rank) != t.island_of(home)) {
        ranks.insert(rank);
        islands.insert(t.island_of(rank));
      }
    remote_ranks += ranks.size();
    remote_islands += islands.size();
  }
  EXPECT_EQ(flat.rows[1][kCross], remote_ranks);
  EXPECT_EQ(hier.rows[0][kCross], remote_islands);
  EXPECT_EQ(hier.rows[1][kCross], 0u);
  EXPECT_LE(hier.rows[0][kCross], flat.rows[1][kCross]);  // strictly fewer: by hand, below
  // The answers crossing back are not more bytes either: one per hop-1 row, a narrowed sum
  // (under 8 bytes an element here) where flat had two or more answers of at least 4 H
  // bytes each.
  EXPECT_LE(hier.combine_bytes[kCross], flat.combine_bytes[kCross]);
  // Each token reaches the same ranks either way: hop 2 holds the same rows in total.
  std::size_t flat_rows = 0, hier_rows = 0;
  for (int l = 0; l < placement::kLinkClasses; ++l) {
    flat_rows += flat.rows[1][l];
    hier_rows += hier.rows[1][l];
  }
  EXPECT_EQ(flat_rows, hier_rows);
}

INSTANTIATE_TEST_SUITE_P(Placements, LayerTraffic, ::testing::Range<std::size_t>(0, placement_cases().size()),
                         [](const ::testing::TestParamInfo<std::size_t>& info) {
                           return placement_cases()[info.param].name;
                         });

// Islands {0, 1} and {2, 3}, expert e on rank e, H = 64 (256-byte rows), two tokens per rank:
//   home 0: token 0 -> experts 2, 3    token 1 -> 1, 2
//   home 1: token 2 -> 2, 3            token 3 -> 0
//   home 2: token 4 -> 0, 1            token 5 -> 3
//   home 3: token 6 -> 2               token 7 -> 0, 1, 3
// Flat, rows by link class (one per token and rank): same rank 1 (7 -> 3); same island 4
// (1 -> 1, 3 -> 0, 5 -> 3, 6 -> 2); across 9 (0 -> 2, 3; 1 -> 2; 2 -> 2, 3; 4 -> 0, 1;
// 7 -> 0, 1). Hierarchical, hop 1: one row per token and remote island: 0, 1, 2, 4, 7 = 5
// across, to gateways 2 (home 0), 3 (home 1), 0 (home 2), 1 (home 3); hop 2 then holds the
// same 14 (token, rank) rows, none across: same rank 1 + 5 at the gateways (0 -> 2, 1 -> 2,
// 2 -> 3, 4 -> 0, 7 -> 1) = 6, same island 4 + 4 forwarded (0 -> 3, 2 -> 2, 4 -> 1, 7 -> 0) = 8.
//
// Bytes across (a message is 16-padded header 8 + 12/row + 12/pair, then 256/row; every
// rank sends every rank a message, 16 bytes when empty):
//   flat dispatch: 0 -> 2 holds 2 rows 2 pairs (64 + 512 = 576), the 7 other cross
//     messages 1 row 1 pair (32 + 256 = 288): 576 + 7 * 288 = 2592.
//   hierarchical hop 1: 0 -> 2: 2 rows 3 pairs (80 + 512 = 592); 1 -> 3, 2 -> 0, 3 -> 1:
//     1 row 2 pairs (48 + 256 = 304); 4 empty: 592 + 3 * 304 + 4 * 16 = 1568; hop 2 sends
//     8 empty messages across: 128. In all 1696.
//   combine, flat: 9 fp32 answers of 256 = 2304; hierarchical: tokens 0, 2, 4, 7 answered
//     in fixed point, token 1 in fp32 (256). At full width a sum is 8 + 512 = 520 bytes
//     (2336 in all, more than flat); narrowed, these sums (|sum| < 2^39) need 5 bytes an
//     element, 8 + 320 = 328: 1568.
TEST(LayerTraffic, TwoExpertsOnTwoRanksOfARemoteIslandCrossOnce) {
  const int H = 64;
  Tokens tokens{8, H, 4, {}, make_routing({{{2, .5f}, {3, .5f}},
                                           {{1, .75f}, {2, .25f}},
                                           {{2, .25f}, {3, .75f}},
                                           {{0, 1}},
                                           {{0, .5f}, {1, .5f}},
                                           {{3, 1}},
                                           {{2, 1}},
                                           {{0, .5f}, {1, .25f}, {3, .25f}}})};
  tokens.x = make_tokens(8, H, 4, 1, 5).x;
  Placement p(4, 1, 4);
  for (int e = 0; e < 4; ++e) p.set_replicas(0, e, {e});
  const Topology t = Topology::blocks(4, 2);
  Traffic flat, hier;
  const std::vector<float> a = run_layer(tokens, p, t, false, 0, 4, 0, &flat);
  const std::vector<float> b = run_layer(tokens, p, t, true, 0, 4, 0, &hier);
  EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0);

  EXPECT_EQ(flat.rows[1][kSameRank], 1u);
  EXPECT_EQ(flat.rows[1][kSameIsland], 4u);
  EXPECT_EQ(flat.rows[1][kCross], 9u);
  EXPECT_EQ(flat.rows[0][kCross] + flat.rows[0][kSameIsland] + flat.rows[0][kSameRank], 0u);
  EXPECT_EQ(hier.rows[0][kCross], 5u);
  EXPECT_EQ(hier.rows[0][kSameIsland] + hier.rows[0][kSameRank], 0u);
  EXPECT_EQ(hier.rows[1][kSameRank], 6u);
  EXPECT_EQ(hier.rows[1][kSameIsland], 8u);
  EXPECT_EQ(hier.rows[1][kCross], 0u);

  EXPECT_EQ(flat.dispatch_bytes[kCross], 2592u);
  EXPECT_EQ(hier.dispatch_bytes[kCross], 1504u);  // 12 empty hop-1 batches send nothing
  EXPECT_EQ(flat.combine_bytes[kCross], 2304u);
  EXPECT_EQ(hier.combine_bytes[kCross], 1568u);
  Traffic full_width;
  const std::vector<float> c = run_layer(tokens, p, t, true, 0, 4, 0, &full_width, false);
  EXPECT_EQ(std::memcmp(a.data(), c.data(), a.size() * sizeof(float)), 0);
  EXPECT_EQ(full_width.combine_bytes[kCross], 2336u);
}

}  // namespace
}  // namespace moed::runtime

namespace moed::runtime {
namespace {

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
  EXPECT_THROW(chunk_replica(in, 1, 0), Error);
}

TEST(SplitExpert, AnswersAreInt64WhenExpertsHaveSeveralChunks) {
  const AnswerFormat one_chunk(8), chunks(8, false);
  EXPECT_TRUE(one_chunk.fp32(1));
  EXPECT_FALSE(chunks.fp32(1));
  EXPECT_EQ(combine_row_bytes(1, one_chunk), 32u);
  EXPECT_EQ(combine_row_bytes(1, chunks), 72u);
  EXPECT_EQ(combine_row_bytes(2, chunks), combine_row_bytes(2, one_chunk));
}

}  // namespace
}  // namespace moed::runtime
