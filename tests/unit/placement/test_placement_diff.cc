// From one placement to the next: relabelling islands and ranks so that few
// slots move, the moves that remain, applying them, and their description.
#include "placement/placement_diff.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <numeric>
#include <string>
#include <tuple>
#include <vector>

#include "common/error.h"
#include "common/rng.h"
#include "placement/placement.h"
#include "placement/topology.h"
#include "tests/unit/test_support.h"

namespace moed::placement {
namespace {

// replicas[l][e]: the ranks of (l, e).
Placement make(int ranks, const std::vector<std::vector<std::vector<int>>>& replicas) {
  Placement p(ranks, int(replicas.size()), int(replicas[0].size()));
  for (int l = 0; l < p.layers(); ++l)
    for (int e = 0; e < p.experts(); ++e) p.set_replicas(l, e, replicas[l][e]);
  return p;
}

Placement random_placement(int ranks, int layers, int experts, std::uint64_t seed) {
  return add_random_replicas(shuffled(ranks, layers, experts, seed), 3, seed + 1000);
}

Placement rename(const Placement& p, const std::vector<int>& new_rank) {
  Placement out = p;
  for (int l = 0; l < p.layers(); ++l) {
    for (int e = 0; e < p.experts(); ++e) {
      std::vector<int> ranks = p.replicas(l, e);
      for (int& r : ranks) r = new_rank[r];
      out.set_replicas(l, e, ranks);
    }
  }
  return out;
}

// A random permutation of ranks that maps islands (equal sizes) onto islands.
std::vector<int> random_island_permutation(const Topology& t, Rng& rng) {
  std::vector<int> islands(t.islands());
  std::iota(islands.begin(), islands.end(), 0);
  for (int i = t.islands() - 1; i > 0; --i) std::swap(islands[i], islands[rng.below(i + 1)]);
  std::vector<int> new_rank(t.ranks());
  for (int i = 0; i < t.islands(); ++i) {
    std::vector<int> from = t.ranks_in(i), onto = t.ranks_in(islands[i]);
    for (int k = int(onto.size()) - 1; k > 0; --k) std::swap(onto[k], onto[rng.below(k + 1)]);
    for (std::size_t k = 0; k < from.size(); ++k) new_rank[from[k]] = onto[k];
  }
  return new_rank;
}

// Equal up to replica order.
void expect_same_slots(const Placement& a, const Placement& b, const std::string& what) {
  ASSERT_EQ(a.layers(), b.layers());
  ASSERT_EQ(a.experts(), b.experts());
  for (int l = 0; l < a.layers(); ++l) {
    for (int e = 0; e < a.experts(); ++e) {
      std::vector<int> x = a.replicas(l, e), y = b.replicas(l, e);
      std::sort(x.begin(), x.end());
      std::sort(y.begin(), y.end());
      EXPECT_EQ(x, y) << what << ": layer " << l << " expert " << e;
    }
  }
}

// The rank permutation that turns `before` into `after` (read from replica
// lists position by position); fails the test if there is none or it splits
// an island. Ranks holding nothing are left unmapped (-1).
std::vector<int> island_preserving_permutation(const Placement& before, const Placement& after,
                                               const Topology& t) {
  std::vector<int> new_rank(before.ranks(), -1);
  for (int l = 0; l < before.layers(); ++l) {
    for (int e = 0; e < before.experts(); ++e) {
      const auto& b = before.replicas(l, e);
      const auto& a = after.replicas(l, e);
      EXPECT_EQ(a.size(), b.size()) << "layer " << l << " expert " << e;
      for (std::size_t k = 0; k < std::min(a.size(), b.size()); ++k) {
        if (new_rank[b[k]] == -1) new_rank[b[k]] = a[k];
        EXPECT_EQ(new_rank[b[k]], a[k]) << "rank " << b[k] << " renamed twice";
      }
    }
  }
  std::map<int, int> island_map;  // island of a rank before -> its island after
  std::vector<bool> taken(before.ranks(), false);
  for (int r = 0; r < before.ranks(); ++r) {
    if (new_rank[r] < 0) continue;
    EXPECT_FALSE(taken[new_rank[r]]) << "two ranks renamed " << new_rank[r];
    taken[new_rank[r]] = true;
    auto [it, inserted] = island_map.emplace(t.island_of(r), t.island_of(new_rank[r]));
    EXPECT_EQ(it->second, t.island_of(new_rank[r])) << "island of rank " << r << " split";
  }
  std::vector<bool> island_taken(t.islands(), false);
  for (auto [from, onto] : island_map) {
    EXPECT_FALSE(island_taken[onto]) << "two islands renamed " << onto;
    island_taken[onto] = true;
  }
  return new_rank;
}

std::size_t move_count(const Placement& current, const Placement& next) {
  return moves(current, next).size();
}

// ---------------------------------------------------------------- relabelling

TEST(Relabel, UndoesAPermutationOfIslandsAndRanks) {
  for (int islands : {1, 2, 4, 8}) {
    const Topology topology = Topology::blocks(8, 8 / islands);
    for (std::uint64_t seed = 0; seed < 20; ++seed) {
      Placement current = random_placement(8, 4, 16, seed);
      current.set_epoch(7);
      Rng rng(hash_combine(hash_name("relabel-permute"), seed));
      Placement next = rename(current, random_island_permutation(topology, rng));
      const Placement got = relabel_to_minimise_moves(current, next, topology);
      EXPECT_EQ(got, current) << islands << " islands, seed " << seed;
      EXPECT_TRUE(moves(current, got).empty());
    }
  }
}

TEST(Relabel, SwappingIslandsBackSavesEveryMove) {
  const Topology topology = Topology::blocks(4, 2);
  const Placement current = contiguous(4, 1, 8);  // ranks hold {0,1} {2,3} | {4,5} {6,7}
  const Placement next = rename(current, {2, 3, 0, 1});  // the islands swapped
  EXPECT_EQ(move_count(current, next), 8u);
  const Placement got = relabel_to_minimise_moves(current, next, topology);
  EXPECT_EQ(got, current);
  EXPECT_EQ(move_count(current, got), 0u);
}

TEST(Relabel, RandomPlacementsNeverMoveMoreAndOnlyRenameRanks) {
  for (int islands : {2, 4}) {
    const Topology topology = Topology::blocks(8, 8 / islands);
    for (std::uint64_t seed = 0; seed < 40; ++seed) {
      const Placement current = random_placement(8, 4, 16, seed);
      // Unrelated placements, and a near one: current with a few experts
      // moved, then its labels scrambled (what an optimiser hands back).
      Rng rng(hash_combine(hash_name("relabel-random"), seed));
      Placement near = current;
      for (int n = 0; n < 6; ++n) {
        const int l = int(rng.below(4)), e = int(rng.below(16));
        near.set_replicas(l, e, {int(rng.below(8))});
      }
      for (const Placement& next :
           {random_placement(8, 4, 16, seed + 500), rename(near, random_island_permutation(topology, rng))}) {
        const Placement got = relabel_to_minimise_moves(current, next, topology);
        SCOPED_TRACE(testing::Message() << islands << " islands, seed " << seed);
        EXPECT_LE(move_count(current, got), move_count(current, next));
        EXPECT_EQ(got.epoch(), next.epoch());
        island_preserving_permutation(next, got, topology);
        // Same loads: the multiset of slot counts per rank is unchanged.
        std::vector<int> a, b;
        for (int r = 0; r < 8; ++r) a.push_back(next.slots_on(r)), b.push_back(got.slots_on(r));
        std::sort(a.begin(), a.end());
        std::sort(b.begin(), b.end());
        EXPECT_EQ(a, b);
      }
      // The near one comes back to at most its 6 changed experts' moves.
      const Placement scrambled = rename(near, random_island_permutation(topology, rng));
      EXPECT_LE(move_count(current, relabel_to_minimise_moves(current, scrambled, topology)),
                move_count(current, near));
    }
  }
}

TEST(Relabel, KeepsMoreSlotsOnTheirRankRatherThanOnTheirIsland) {
  // Renaming the islands would keep 8 slots on their island (layer 0) but only
  // 4 on their rank, against 6 on their rank without renaming (layer 1): the
  // fewest moves (8 rather than 10) come from leaving the islands alone.
  const Topology topology = Topology::blocks(4, 2);
  const std::vector<std::vector<int>> layer1{{0}, {0}, {1}, {1}, {2}, {2}, {0, 1, 2, 3},
                                             {0, 1, 2, 3}};
  const Placement current = make(4, {{{0}, {0}, {1}, {1}, {2}, {2}, {3}, {3}}, layer1});
  const Placement next = make(4, {{{2}, {3}, {2}, {3}, {0}, {1}, {0}, {1}}, layer1});
  EXPECT_EQ(move_count(current, next), 8u);
  EXPECT_EQ(move_count(current, rename(next, {2, 3, 0, 1})), 10u);
  EXPECT_EQ(relabel_to_minimise_moves(current, next, topology), next);
}

TEST(Relabel, BetweenEqualMovesKeepsMoreSlotsOnTheirIsland) {
  // Either way two slots move; renaming the islands moves one of them inside
  // an island (expert 1 of layer 1 from rank 0 to rank 1) instead of across.
  const Topology topology = Topology::blocks(4, 2);
  const Placement current = make(4, {{{0}, {0, 1, 2, 3}}, {{0}, {0}}});
  const Placement next = make(4, {{{0}, {0, 1, 2, 3}}, {{2}, {3}}});
  const Placement got = relabel_to_minimise_moves(current, next, topology);
  EXPECT_EQ(got.replicas(0, 0), std::vector<int>{2});
  EXPECT_EQ(got.replicas(1, 0), std::vector<int>{0});
  EXPECT_EQ(got.replicas(1, 1), std::vector<int>{1});
  EXPECT_EQ(move_count(current, got), move_count(current, next));
}

TEST(Relabel, UnequalIslandsRenameRanksOnlyInsideIslands) {
  const Topology topology({0, 0, 0, 1});
  const Placement current = random_placement(4, 2, 8, 3);
  // Inside island 0: undone.
  EXPECT_EQ(relabel_to_minimise_moves(current, rename(current, {2, 0, 1, 3}), topology), current);
  // Across islands: rank 3 stays rank 3.
  const Placement next = rename(current, {3, 1, 2, 0});
  const Placement got = relabel_to_minimise_moves(current, next, topology);
  const auto new_rank = island_preserving_permutation(next, got, topology);
  EXPECT_EQ(new_rank[3], 3);
  EXPECT_LE(move_count(current, got), move_count(current, next));
}

TEST(Relabel, MismatchedShapesAreInternalErrors) {
  const Placement current = contiguous(4, 2, 8);
  test::expect_error(
      [&] { relabel_to_minimise_moves(current, contiguous(4, 2, 6), Topology::blocks(4, 2)); },
      ErrorKind::Internal, {"different shapes"});
  test::expect_error(
      [&] { relabel_to_minimise_moves(current, current, Topology::blocks(8, 2)); },
      ErrorKind::Internal, {"8 ranks", "4 ranks"});
}

// ---------------------------------------------------------------------- moves

TEST(Moves, IdenticalPlacementsHaveNone) {
  const Placement p = random_placement(8, 4, 16, 1);
  EXPECT_TRUE(moves(p, p).empty());
  Placement reordered = p;  // the same slots, replicas listed in another order
  for (int l = 0; l < p.layers(); ++l)
    for (int e = 0; e < p.experts(); ++e) {
      std::vector<int> r = p.replicas(l, e);
      std::reverse(r.begin(), r.end());
      reordered.set_replicas(l, e, r);
    }
  EXPECT_TRUE(moves(p, reordered).empty());
}

TEST(Moves, OneExpertMoved) {
  const Placement current = make(4, {{{0}, {1}}});
  const Placement next = make(4, {{{2}, {1}}});
  EXPECT_EQ(moves(current, next), (std::vector<Move>{{0, 0, 0, 2, 0}}));
}

TEST(Moves, NewReplicasAndReleases) {
  const Placement current = make(6, {{{1}, {1, 3}, {0, 2}}});
  const Placement next = make(6, {{{1, 5}, {1}, {4}}});
  const std::vector<Move> want{
      {0, 0, 1, 5, -1},   // new replica on 5, copied from 1
      {0, 1, -1, -1, 3},  // release of rank 3
      {0, 2, 2, 4, 0},    // 0 -> 4 pairs with the lowest removed rank, read from the other holder
      {0, 2, -1, -1, 2},  // ... and rank 2 is released (ordered by `to`: releases first)
  };
  std::vector<Move> got = moves(current, next);
  std::vector<Move> sorted_want = want;
  std::sort(sorted_want.begin(), sorted_want.end(), [](const Move& a, const Move& b) {
    return std::tie(a.layer, a.expert, a.to) < std::tie(b.layer, b.expert, b.to);
  });
  EXPECT_EQ(got, sorted_want);
}

TEST(Moves, PairsAddedAndRemovedRanksInAscendingOrderAndReadsFromAKeptRank) {
  // Expert 0: 3 stays, {0, 1} leave, {5, 6} arrive: 0 -> 5 and 1 -> 6, both
  // read from rank 3, which keeps its slot whatever subset is applied.
  // Expert 1: nothing stays: each move reads from a rank other than its drop.
  const Placement current = make(8, {{{3, 1, 0}, {0, 1}}});
  const Placement next = make(8, {{{6, 3, 5}, {7, 2}}});
  EXPECT_EQ(moves(current, next), (std::vector<Move>{{0, 0, 3, 5, 0},
                                                      {0, 0, 3, 6, 1},
                                                      {0, 1, 1, 2, 0},
                                                      {0, 1, 0, 7, 1}}));
}

TEST(Moves, OrderedByLayerExpertAndDestination) {
  for (std::uint64_t seed = 0; seed < 20; ++seed) {
    const auto got = moves(random_placement(8, 4, 16, seed), random_placement(8, 4, 16, seed + 77));
    EXPECT_TRUE(std::is_sorted(got.begin(), got.end(), [](const Move& a, const Move& b) {
      return std::tie(a.layer, a.expert, a.to) < std::tie(b.layer, b.expert, b.to);
    })) << "seed " << seed;
  }
}

TEST(Moves, ApplyingAllMovesGivesTheNextPlacement) {
  for (std::uint64_t seed = 0; seed < 50; ++seed) {
    const Placement current = random_placement(8, 4, 16, seed);
    const Placement next = add_random_replicas(shuffled(8, 4, 16, seed + 300), int(seed % 5), seed);
    const auto all = moves(current, next);
    for (const Move& m : all) {
      if (m.to >= 0) {
        ASSERT_GE(m.from, 0);
        const auto& holders = current.replicas(m.layer, m.expert);
        EXPECT_NE(std::find(holders.begin(), holders.end(), m.from), holders.end())
            << "move reads from a rank that does not hold the expert";
      }
    }
    expect_same_slots(apply_moves(current, all), next, "seed " + std::to_string(seed));
    // And the other way round, where releases become new replicas.
    expect_same_slots(apply_moves(next, moves(next, current)), current,
                      "back, seed " + std::to_string(seed));
  }
}

TEST(Moves, AnySubsetOfMovesGivesAValidPlacement) {
  for (std::uint64_t seed = 0; seed < 30; ++seed) {
    const Placement current = random_placement(8, 4, 16, seed);
    const Placement next = add_random_replicas(shuffled(8, 4, 16, seed + 300), 2, seed + 9);
    const auto all = moves(current, next);
    Rng rng(hash_combine(hash_name("move-subsets"), seed));
    std::vector<Move> some;
    for (const Move& m : all)
      if (rng.below(2)) some.push_back(m);
    std::reverse(some.begin(), some.end());  // order does not matter either
    const Placement got = apply_moves(current, some);
    EXPECT_NO_THROW(got.validate("subset"));
    EXPECT_EQ(moves(got, next).size(), all.size() - some.size()) << "seed " << seed;
  }
}

TEST(Moves, ApplyKeepsTheEpochAndReplicaPositions) {
  Placement current = make(4, {{{0, 1}, {2}}});
  current.set_epoch(3);
  const Placement got = apply_moves(current, {{0, 0, 1, 3, 0}, {0, 1, 2, 0, -1}});
  EXPECT_EQ(got.epoch(), 3u);
  EXPECT_EQ(got.replicas(0, 0), (std::vector<int>{3, 1}));  // 3 takes 0's place
  EXPECT_EQ(got.replicas(0, 1), (std::vector<int>{2, 0}));
}

TEST(Moves, InconsistentMovesAreInternalErrors) {
  const Placement current = make(4, {{{0}, {1, 2}}});
  test::expect_error([&] { apply_moves(current, {{0, 1, 1, 2, -1}}); }, ErrorKind::Internal,
                     {"layer 0 expert 1", "rank 2 already holds"});
  test::expect_error([&] { apply_moves(current, {{0, 0, 0, 3, 1}}); }, ErrorKind::Internal,
                     {"layer 0 expert 0", "rank 1 holds no slot"});
  test::expect_error([&] { apply_moves(current, {{0, 0, -1, -1, 0}}); }, ErrorKind::Internal,
                     {"layer 0 expert 0", "rank 0", "no slot"});
  test::expect_error([&] { apply_moves(current, {{0, 1, -1, -1, 1}, {0, 1, -1, -1, 2}}); },
                     ErrorKind::Internal, {"layer 0 expert 1", "releasing rank 2"});
  test::expect_error([&] { apply_moves(current, {{1, 0, 0, 3, -1}}); }, ErrorKind::Internal,
                     {"layer 1 expert 0", "outside"});
  test::expect_error([&] { apply_moves(current, {{0, 0, 0, 4, -1}}); }, ErrorKind::Internal,
                     {"layer 0 expert 0", "rank 4 outside 0..3"});
  test::expect_error([&] { apply_moves(current, {{0, 0, 0, -1, -1}}); }, ErrorKind::Internal,
                     {"layer 0 expert 0", "neither"});
}

TEST(Moves, MismatchedShapesAreInternalErrors) {
  test::expect_error([] { moves(contiguous(4, 2, 8), contiguous(8, 2, 8)); }, ErrorKind::Internal,
                     {"different shapes"});
}

TEST(Moves, Describe) {
  EXPECT_EQ(describe_moves({}), "");
  EXPECT_EQ(describe_moves({{3, 17, 2, 9, 2}, {0, 4, 1, 5, -1}, {0, 4, -1, -1, 3}, {1, 2, 1, 6, 0}}),
            "layer 3 expert 17: rank 2 -> rank 9 (drops rank 2)\n"
            "layer 0 expert 4: new replica on rank 5 (copied from rank 1)\n"
            "layer 0 expert 4: releases rank 3\n"
            "layer 1 expert 2: rank 1 -> rank 6 (drops rank 0)\n");
}

}  // namespace
}  // namespace moed::placement
