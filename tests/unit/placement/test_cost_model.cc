// The cost model on hand-computed cases: copies per token (cross-island as
// hierarchical dispatch sends them, same-island fan-out), the choice among
// replicas, rank and island loads, token ranges and move costs.
#include "placement/cost_model.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <utility>
#include <vector>

#include "common/error.h"
#include "common/rng.h"
#include "placement/placement.h"
#include "placement/topology.h"
#include "routing/routing_trace.h"
#include "tests/unit/test_support.h"

namespace moed::placement {
namespace {

using routing::RoutingChoice;
using routing::RoutingTrace;
using Experts = std::vector<std::uint32_t>;

// One token's choices per layer, gate weights 1/k each ({} : no routing).
std::vector<std::vector<RoutingChoice>> path(const std::vector<Experts>& per_layer) {
  std::vector<std::vector<RoutingChoice>> out;
  for (const Experts& experts : per_layer) {
    std::vector<RoutingChoice> cell;
    for (std::uint32_t e : experts) cell.push_back({e, 1.0f / float(experts.size())});
    out.push_back(cell);
  }
  return out;
}

// tokens[i][l]: the experts of token i in layer l.
RoutingTrace make_trace(int layers, int experts, const std::vector<std::vector<Experts>>& tokens) {
  RoutingTrace t(layers, experts);
  for (const auto& token : tokens) t.add_token(path(token));
  return t;
}

// A one-layer trace: tokens[i] are the experts of token i.
RoutingTrace one_layer(int experts, const std::vector<Experts>& tokens) {
  RoutingTrace t(1, experts);
  for (const Experts& token : tokens) t.add_token(path({token}));
  return t;
}

// replicas[l][e]: the ranks of (l, e), in replica order.
Placement make(int ranks, const std::vector<std::vector<std::vector<int>>>& replicas) {
  Placement p(ranks, int(replicas.size()), int(replicas[0].size()));
  for (int l = 0; l < p.layers(); ++l)
    for (int e = 0; e < p.experts(); ++e) p.set_replicas(l, e, replicas[l][e]);
  return p;
}

// 4 ranks in 2 islands {0,1} {2,3}.
const Topology& two_by_two() {
  static const Topology t({0, 0, 1, 1});
  return t;
}

void expect_cost(const Cost& c, double cross, double same, double rank_load, double island_load,
                 std::uint64_t cells) {
  EXPECT_DOUBLE_EQ(c.cross_island_copies_per_token, cross);
  EXPECT_DOUBLE_EQ(c.same_island_copies_per_token, same);
  EXPECT_DOUBLE_EQ(c.max_mean_rank_load, rank_load);
  EXPECT_DOUBLE_EQ(c.max_mean_island_load, island_load);
  EXPECT_EQ(c.token_layers, cells);
}

TEST(CostModel, HandComputedMixOfTokens) {
  // Expert e on rank e. Homes: token i on rank i mod 4.
  //   token 0 (home 0) {0,1}: rank 0 is home, rank 1 the home island -> 0 cross, 1 same
  //   token 1 (home 1) {0,2}: rank 0 home island, rank 2 island 1     -> 1 cross, 1 same
  //   token 2 (home 2) {3}:   rank 3 home island                      -> 0 cross, 1 same
  // Per token: cross 1/3, same 3/3 = 1.
  // Rank loads 2,1,1,1: max 2 / mean 5/4 = 1.6.
  // Island loads per rank: island 0 (2+1)/2 = 1.5, island 1 (1+1)/2 = 1: 1.5 / 1.25 = 1.2.
  RoutingTrace trace = one_layer(4, {{0, 1}, {0, 2}, {3}});
  Cost c = evaluate(trace, contiguous(4, 1, 4), two_by_two());
  expect_cost(c, 1.0 / 3, 1.0, 1.6, 1.2, 3);
}

TEST(CostModel, TokenServedAtHomeHasNoCopies) {
  // Experts 0 and 1 both on rank 0; token 0 (home 0) goes to {0,1}: nothing travels.
  // Rank loads 2,0,0,0: 2 / (2/4) = 4; island loads per rank 1, 0: 1 / 0.5 = 2.
  Placement p = make(4, {{{0}, {0}, {2}, {3}}});
  Cost c = evaluate(one_layer(4, {{0, 1}}), p, two_by_two());
  expect_cost(c, 0, 0, 4.0, 2.0, 1);
}

TEST(CostModel, RemoteIslandIsOneCopyThenFanOutInside) {
  // Token 0 (home 0) to experts {2,3}, on ranks 2 and 3 of island 1: one copy
  // crosses to the island, then one more rank inside it -> 1 cross + 1 same.
  Cost c = evaluate(one_layer(4, {{2, 3}}), contiguous(4, 1, 4), two_by_two());
  EXPECT_DOUBLE_EQ(c.cross_island_copies_per_token, 1);
  EXPECT_DOUBLE_EQ(c.same_island_copies_per_token, 1);

  // {1,2,3} from home 0: rank 1 (home island) + island 1 (1 cross, 1 beyond the first).
  c = evaluate(one_layer(4, {{1, 2, 3}}), contiguous(4, 1, 4), two_by_two());
  EXPECT_DOUBLE_EQ(c.cross_island_copies_per_token, 1);
  EXPECT_DOUBLE_EQ(c.same_island_copies_per_token, 2);
}

TEST(CostModel, TwoExpertsOnOneRemoteRankTravelOnce) {
  // Experts 2 and 3 both on rank 2; token 0 (home 0) sends one copy to island 1,
  // rank 2 serves both pairs: rank loads 0,0,2,0.
  Placement p = make(4, {{{0}, {1}, {2}, {2}}});
  Cost c = evaluate(one_layer(4, {{2, 3}}), p, two_by_two());
  expect_cost(c, 1, 0, 4.0, 2.0, 1);
}

TEST(CostModel, ASplitExpertIsPricedAsShardsNotReplicas) {
  // Expert 2 split over ranks 2 and 3 (island 1): token 0 (home 0) sends one
  // copy to island 1, fanned out to both shards (1 cross + 1 same), and each
  // shard does half the pair: rank loads 0,0,0.5,0.5 -> 0.5 / 0.25 = 2;
  // island loads per rank 0 and 0.5 -> 0.5 / 0.25 = 2.
  Placement p = make(4, {{{0}, {1}, {2}, {3}}});
  p.set_shards(0, 2, {2, 3});
  expect_cost(evaluate(one_layer(4, {{2}}), p, two_by_two()), 1, 1, 2.0, 2.0, 1);
  // As replicas, the same ranks would take the pair whole on one of them, with no fan-out.
  p.set_replicas(0, 2, {2, 3});
  expect_cost(evaluate(one_layer(4, {{2}}), p, two_by_two()), 1, 0, 4.0, 2.0, 1);
  // Home on a shard's rank: the other shard is one same-island copy.
  p.set_shards(0, 2, {2, 3});
  RoutingTrace from_rank_2(1, 4);
  for (int i = 0; i < 3; ++i) from_rank_2.add_token(path({{}}));
  from_rank_2.add_token(path({{2}}));  // token 3: home rank 3
  expect_cost(evaluate(from_rank_2, p, two_by_two()), 0, 1, 2.0, 2.0, 1);
}

TEST(CostModel, ASplitExpertHeldTwiceServesEachTokenFromItsNearCopy) {
  // Expert 2 in copies of 2 shards, {0, 1} on island 0 and {2, 3} on island 1.
  // Token 0 (home 0) and token 2 (home 2) each reach their own island's copy:
  // no crossing, one fan-out inside; every rank does half a pair.
  Placement p = make(4, {{{0}, {1}, {2}, {3}}});
  p.set_shards(0, 2, {0, 1, 2, 3}, 2);
  expect_cost(evaluate(one_layer(4, {{2}, {}, {2}}), p, two_by_two()), 0, 1, 1.0, 1.0, 2);
  // Held once on island 1, token 0 crosses to it.
  p.set_shards(0, 2, {2, 3});
  expect_cost(evaluate(one_layer(4, {{2}, {}, {2}}), p, two_by_two()), 0.5, 1, 2.0, 2.0, 2);
}

TEST(CostModel, CellsAreCountedByTheIslandsTheyTouch) {
  // 6 ranks in 3 islands of 2, expert e on rank e. Homes: token i on rank i mod 6.
  //   token 0 (home 0) {0}:       island 0              -> 1 island
  //   token 1 (home 1) {2, 4}:    islands 1, 2 (not 0)  -> 2 islands
  //   token 2 (home 2) {0, 3, 5}: islands 0, 1, 2       -> 3 islands
  //   token 3 (home 3) {}:        no routing, not counted
  const Topology t({0, 0, 1, 1, 2, 2});
  RoutingTrace trace = one_layer(6, {{0}, {2, 4}, {0, 3, 5}, {}});
  const Cost c = evaluate(trace, contiguous(6, 1, 6), t);
  EXPECT_EQ(c.token_layers_by_islands, (std::vector<std::uint64_t>{0, 1, 1, 1}));
  EXPECT_DOUBLE_EQ(c.share_over_islands(1), 2.0 / 3);
  EXPECT_DOUBLE_EQ(c.share_over_islands(2), 1.0 / 3);
  EXPECT_DOUBLE_EQ(c.share_over_islands(3), 0);
  EXPECT_DOUBLE_EQ(Cost{}.share_over_islands(4), 0);
}

TEST(CostModel, ReplicaOnHomeRankIsPreferred) {
  // Expert 2 on ranks {2, 0} (rank 2 listed first); token 0 (home 0) uses the one at home.
  Placement p = make(4, {{{1}, {1}, {2, 0}, {3}}});
  Cost c = evaluate(one_layer(4, {{2}}), p, two_by_two());
  expect_cost(c, 0, 0, 4.0, 2.0, 1);
}

TEST(CostModel, ReplicaInHomeIslandIsPreferred) {
  // Expert 2 on ranks {2, 1}; token 0 (home 0) uses rank 1 in its island: 1 same, 0 cross.
  // Rank loads 0,1,0,0 -> 4; islands 0.5, 0 -> 2.
  Placement p = make(4, {{{0}, {1}, {2, 1}, {3}}});
  Cost c = evaluate(one_layer(4, {{2}}), p, two_by_two());
  expect_cost(c, 0, 1, 4.0, 2.0, 1);
}

TEST(CostModel, ReplicaInVisitedIslandIsPreferredOverNewIsland) {
  // 6 ranks, islands {0,1} {2,3} {4,5}. Token 0 (home 0) routes to [A=0, B=1]:
  // A on rank 2 takes the token to island 1; B on ranks {4, 3} (island 2 listed
  // first) is served on rank 3 in island 1, already visited:
  // 1 cross (island 1) + 1 same (rank 3 beyond rank 2). Rank 4 would give 2 cross.
  const Topology three({0, 0, 1, 1, 2, 2});
  Placement p = make(6, {{{2}, {4, 3}}});
  Cost c = evaluate(one_layer(2, {{0, 1}}), p, three);
  EXPECT_DOUBLE_EQ(c.cross_island_copies_per_token, 1);
  EXPECT_DOUBLE_EQ(c.same_island_copies_per_token, 1);
}

TEST(CostModel, EqualReplicasSplitLoadEvenly) {
  // Expert 2 on ranks {2, 3}. 8 tokens; only those homed in island 0 (tokens
  // 0, 1, 4, 5: homes 0, 1, 0, 1) route to {2}; the others have no routing.
  // Neither replica is home or home island: ties go to the least loaded so
  // far, so ranks 2 and 3 serve 2 each: rank loads 0,0,2,2 -> 2 / (4/4) = 2
  // (always the first replica would give 4). Island 1: 4 / 2 ranks = 2 -> 2 / 1 = 2.
  // Each routed token: 1 cross, 0 same; 4 routed cells.
  Placement p = make(4, {{{0}, {1}, {2, 3}, {3}}});
  RoutingTrace t = one_layer(4, {{2}, {2}, {}, {}, {2}, {2}, {}, {}});
  expect_cost(evaluate(t, p, two_by_two()), 1, 0, 2.0, 2.0, 4);
}

TEST(CostModel, EqualReplicasSplitLoadEvenlyOverManyTokens) {
  // 1 layer, 2 experts on 4 ranks of one island: expert 0 on ranks {1, 2, 3}.
  // 400 tokens all to {0}: homes 1, 2, 3 serve their own (100 each); the 100
  // homed on rank 0 take the least loaded replica, which keeps the three even
  // to within one token: loads 0, 133..134, 133, 133 -> max/mean = 134/100.
  const Topology one_island({0, 0, 0, 0});
  Placement p = make(4, {{{1, 2, 3}, {0}}});
  RoutingTrace t = one_layer(2, std::vector<Experts>(400, Experts{0}));
  Cost c = evaluate(t, p, one_island);
  EXPECT_DOUBLE_EQ(c.max_mean_rank_load, 134.0 / 100.0);
  EXPECT_DOUBLE_EQ(c.max_mean_island_load, 1.0);
  EXPECT_DOUBLE_EQ(c.cross_island_copies_per_token, 0);
  // Home-rank tokens (300) stay; the 100 from rank 0 make one copy each.
  EXPECT_DOUBLE_EQ(c.same_island_copies_per_token, 100.0 / 400.0);
}

TEST(CostModel, EmptyCellsAreSkipped) {
  // Two layers, contiguous. Token 0 (home 0): layer 0 {1} (1 same), layer 1 nothing.
  // Token 1 (home 1): layer 0 nothing, layer 1 {2} (1 cross). 2 routed cells.
  // Layer 0 loads 0,1,0,0: max 1, mean 1/4; layer 1 loads 0,0,1,0: max 1, mean 1/4.
  // Rank load: (1 + 1) / (1/4 + 1/4) = 4; island: per rank 1/2 each layer -> 1 / 0.5 = 2.
  RoutingTrace t = make_trace(2, 4, {{{1}, {}}, {{}, {2}}});
  expect_cost(evaluate(t, contiguous(4, 2, 4), two_by_two()), 0.5, 0.5, 4.0, 2.0, 2);
}

TEST(CostModel, LoadsAreSumOfMaxOverSumOfMean) {
  // Token 0 (home 0), contiguous: layer 0 {0,1}, layer 1 {0,1,2,3}.
  //   layer 0: rank loads 1,1,0,0 (max 1, mean 0.5); islands per rank 1, 0 (max 1, mean 0.5)
  //            copies: rank 1 -> 1 same
  //   layer 1: rank loads 1,1,1,1 (max 1, mean 1); islands 1, 1 (max 1, mean 1)
  //            copies: rank 1 (1 same), island 1 (1 cross + 1 same)
  // Rank load (1 + 1) / (0.5 + 1) = 4/3, not the mean of ratios (2 + 1) / 2 = 1.5.
  // Per token-layer: cross 1/2, same 3/2.
  RoutingTrace t = make_trace(2, 4, {{{0, 1}, {0, 1, 2, 3}}});
  expect_cost(evaluate(t, contiguous(4, 2, 4), two_by_two()), 0.5, 1.5, 4.0 / 3, 4.0 / 3, 2);
}

TEST(CostModel, IslandLoadIsPerRankOfUnequalIslands) {
  // 3 ranks: islands {0,1} and {2}. Expert e on rank e; tokens 0, 1, 2 each
  // route to {0}, {1}, {2} (homes 0, 1, 2: all served at home).
  // Rank loads 1,1,1 -> 1. Islands per rank: 2/2 = 1 and 1/1 = 1 -> 1.
  const Topology uneven({0, 0, 1});
  RoutingTrace t = one_layer(3, {{0}, {1}, {2}});
  expect_cost(evaluate(t, contiguous(3, 1, 3), uneven), 0, 0, 1.0, 1.0, 3);
  // Now token 2 routes to {0}: rank loads 2,1,0 -> 2 / 1 = 2; islands per
  // rank 3/2 = 1.5 and 0 -> 1.5. Token 2 (home 2) crosses to island 0.
  t = one_layer(3, {{0}, {1}, {0}});
  expect_cost(evaluate(t, contiguous(3, 1, 3), uneven), 1.0 / 3, 0, 2.0, 1.5, 3);
}

TEST(CostModel, TokenRangeKeepsTraceIndexAsHome) {
  // Four tokens all to expert 0 (rank 0). Tokens [1, 3): token 1 (home 1)
  // -> 1 same; token 2 (home 2) -> 1 cross. Per token 0.5 and 0.5. Homes
  // counted from the range start (0 and 1) would give 0 cross.
  RoutingTrace t = one_layer(4, {{0}, {0}, {0}, {0}});
  Cost c = evaluate(t, 1, 2, contiguous(4, 1, 4), two_by_two());
  EXPECT_DOUBLE_EQ(c.cross_island_copies_per_token, 0.5);
  EXPECT_DOUBLE_EQ(c.same_island_copies_per_token, 0.5);
  EXPECT_EQ(c.token_layers, 2u);
  // Token 3 alone (home 3): crosses.
  c = evaluate(t, 3, 1, contiguous(4, 1, 4), two_by_two());
  EXPECT_DOUBLE_EQ(c.cross_island_copies_per_token, 1);
  EXPECT_EQ(c.token_layers, 1u);
  // No tokens: nothing counted.
  c = evaluate(t, 2, 0, contiguous(4, 1, 4), two_by_two());
  expect_cost(c, 0, 0, 0, 0, 0);
}

TEST(CostModel, ExtraTraceLayersAreIgnored) {
  // A 2-layer trace on a 1-layer placement: only layer 0 counts.
  // Token 0 (home 0): layer 0 {0} (at home), layer 1 {2} (ignored).
  RoutingTrace t = make_trace(2, 4, {{{0}, {2}}});
  Cost c = evaluate(t, contiguous(4, 1, 4), two_by_two());
  expect_cost(c, 0, 0, 4.0, 2.0, 1);
}

// A random trace with some empty cells and a placement with replicas.
RoutingTrace random_trace(int layers, int experts, int top_k, std::size_t tokens, std::uint64_t seed) {
  Rng rng(seed);
  RoutingTrace t(layers, experts);
  for (std::size_t i = 0; i < tokens; ++i) {
    std::vector<Experts> token(layers);
    for (int l = 0; l < layers; ++l) {
      if (rng.below(10) == 0) continue;  // no routing in this cell
      while (int(token[l].size()) < top_k) {
        auto e = std::uint32_t(rng.below(std::uint64_t(experts)));
        if (std::find(token[l].begin(), token[l].end(), e) == token[l].end()) token[l].push_back(e);
      }
    }
    t.add_token(path(token));
  }
  return t;
}

TEST(CostModel, EvaluateLayerEqualsEvaluateOnOneLayerTrace) {
  const Topology topo = Topology::blocks(6, 2);
  const int L = 3, E = 12;
  RoutingTrace t = random_trace(L, E, 3, 200, 7);
  Placement p = add_random_replicas(shuffled(6, L, E, 3), 4, 5);
  for (int l = 0; l < L; ++l) {
    SCOPED_TRACE(testing::Message() << "layer " << l);
    RoutingTrace single(1, E);
    Placement p1(6, 1, E);
    for (int e = 0; e < E; ++e) p1.set_replicas(0, e, p.replicas(l, e));
    for (std::size_t i = 0; i < t.tokens(); ++i) {
      auto cell = t.at(i, l);
      single.add_token({std::vector<RoutingChoice>(cell.begin(), cell.end())});
    }
    for (auto [first, count] : {std::pair<std::size_t, std::size_t>{0, 200}, {37, 101}}) {
      Cost a = evaluate_layer(t, first, count, l, p, topo);
      Cost b = evaluate(single, first, count, p1, topo);
      EXPECT_EQ(a.cross_island_copies_per_token, b.cross_island_copies_per_token);
      EXPECT_EQ(a.same_island_copies_per_token, b.same_island_copies_per_token);
      EXPECT_EQ(a.max_mean_rank_load, b.max_mean_rank_load);
      EXPECT_EQ(a.max_mean_island_load, b.max_mean_island_load);
      EXPECT_EQ(a.token_layers, b.token_layers);
      EXPECT_GT(a.token_layers, 0u);
    }
  }
}

TEST(CostModel, MoveCostCountsNewSlotsAndBytes) {
  // From contiguous (expert e on rank e) to: e0 {1} (1 new), e1 {1, 2} (1 new,
  // a replica), e2 {2} (kept), e3 {0} (1 new) -> 3 slots, 3 x 1000 bytes.
  Placement to = make(4, {{{1}, {1, 2}, {2}, {0}}});
  MoveCost m = move_cost(contiguous(4, 1, 4), to, 1000);
  EXPECT_EQ(m.slots, 3u);
  EXPECT_EQ(m.bytes, 3000u);
  // Back again: e0 -> 0, e1 keeps rank 1 (the replica on 2 is released, free),
  // e3 -> 3: 2 slots.
  m = move_cost(to, contiguous(4, 1, 4), 1000);
  EXPECT_EQ(m.slots, 2u);
  EXPECT_EQ(m.bytes, 2000u);
  // Replica order does not matter; nothing moves between equal placements.
  Placement reordered = make(4, {{{1}, {2, 1}, {2}, {0}}});
  EXPECT_EQ(move_cost(to, reordered, 1000).slots, 0u);
  EXPECT_EQ(move_cost(to, reordered, 1000).bytes, 0u);
  // Counted over every layer.
  m = move_cost(contiguous(4, 3, 8), round_robin(4, 3, 8), 7);
  // Per layer: contiguous e -> e/2, round-robin e -> e%4; same rank for e = 0 and 7 only.
  EXPECT_EQ(m.slots, 3u * 6);
  EXPECT_EQ(m.bytes, 3u * 6 * 7);
}

TEST(CostModel, ShapeMismatchesAreInternalErrors) {
  RoutingTrace t = one_layer(4, {{0}, {1}});
  // Placement for 8 ranks, topology of 4.
  test::expect_error([&] { evaluate(t, contiguous(8, 1, 4), two_by_two()); }, ErrorKind::Internal,
                     {"8 ranks", "4"});
  // Fewer experts than the trace routes to.
  test::expect_error([&] { evaluate(t, contiguous(4, 1, 2), two_by_two()); }, ErrorKind::Internal, {});
  // Token range beyond the trace.
  test::expect_error([&] { evaluate(t, 1, 2, contiguous(4, 1, 4), two_by_two()); },
                     ErrorKind::Internal, {"[1, 3)", "2"});
  // evaluate_layer: a layer the placement lacks.
  test::expect_error([&] { evaluate_layer(make_trace(2, 4, {{{0}, {1}}}), 0, 1, 1, contiguous(4, 1, 4), two_by_two()); },
                     ErrorKind::Internal, {});
  test::expect_error([&] { evaluate_layer(t, 0, 2, 0, contiguous(8, 1, 4), two_by_two()); },
                     ErrorKind::Internal, {});
  // move_cost between placements of different shapes.
  test::expect_error([&] { move_cost(contiguous(4, 1, 4), contiguous(4, 2, 4), 1); },
                     ErrorKind::Internal, {"different shapes"});
  test::expect_error([&] { move_cost(contiguous(4, 1, 4), contiguous(4, 1, 8), 1); },
                     ErrorKind::Internal, {"different shapes"});
}

}  // namespace
}  // namespace moed::placement
