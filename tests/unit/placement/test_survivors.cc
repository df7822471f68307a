// The survivors as the next epoch's ranks (placement/survivors.h): a
// placement after a loss renumbered over the members, replicas and shards in
// their order, that serves every expert from the same processes; a slot
// left on a lost rank refused; islands that lost every rank gone and the
// rest renumbered densely, link costs kept. Checked over every lost rank of
// a redundant placement: drop, adopt, renumber, valid.
#include "placement/survivors.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "common/error.h"
#include "placement/redundancy.h"
#include "tests/unit/placement/hot_expert_stats.h"
#include "tests/unit/test_support.h"

namespace moed::placement {
namespace {

TEST(Survivors, APlacementIsRenumberedOverTheMembers) {
  Placement p(4, 1, 4);
  p.set_epoch(7);
  p.set_replicas(0, 0, {0});
  p.set_replicas(0, 1, {3, 1});         // replica order kept
  p.set_shards(0, 2, {1, 3}, 2);        // shard order kept
  p.set_replicas(0, 3, {3});
  const Placement q = placement_on_members(p, {0, 1, 3});  // world rank 2 lost, held nothing
  EXPECT_EQ(q.ranks(), 3);
  EXPECT_EQ(q.epoch(), 7u);
  EXPECT_EQ(q.replicas(0, 0), std::vector<int>{0});
  EXPECT_EQ(q.replicas(0, 1), (std::vector<int>{2, 1}));
  EXPECT_EQ(q.shards(0, 2), 2);
  EXPECT_EQ(q.replicas(0, 2), (std::vector<int>{1, 2}));
  EXPECT_EQ(q.replicas(0, 3), std::vector<int>{2});
  q.validate("renumbered");
  // Everyone kept: the same placement.
  EXPECT_EQ(placement_on_members(p, {0, 1, 2, 3}), p);
}

TEST(Survivors, ASlotOnARankLeftOutIsRefused) {
  const Placement p = contiguous(4, 1, 4);
  test::expect_error([&] { placement_on_members(p, {0, 1, 3}); }, ErrorKind::Internal,
                     {"layer 0 expert 2 has a slot on rank 2, not among [0 1 3]"});
  test::expect_error([&] { placement_on_members(p, {1, 0}); }, ErrorKind::Internal, {"not ascending"});
  test::expect_error([&] { placement_on_members(p, {}); }, ErrorKind::Internal, {"not ascending"});
  test::expect_error([&] { placement_on_members(p, {0, 4}); }, ErrorKind::Internal, {"ranks of 4"});
}

TEST(Survivors, IslandsThatLostEveryRankGoAndTheRestAreRenumbered) {
  Topology t({0, 0, 1, 1, 2, 2});
  t.set_link_costs(2, 10);
  const Topology q = topology_on_members(t, {0, 1, 4, 5});  // island 1 lost whole
  EXPECT_EQ(q.island_of_ranks(), (std::vector<int>{0, 0, 1, 1}));
  EXPECT_EQ(q.islands(), 2);
  EXPECT_EQ(q.link_cost(LinkClass::SameIsland), 2);
  EXPECT_EQ(q.link_cost(LinkClass::CrossIsland), 10);
  EXPECT_EQ(topology_on_members(t, {1, 2, 5}).island_of_ranks(), (std::vector<int>{0, 1, 2}));
}

// A join slot is an island of its own until its process comes; then it
// takes the island of the first other present rank on its host (a lost or
// absent rank's host does not count), and the islands are renumbered densely.
TEST(Survivors, AJoinerTakesTheIslandOfItsHost) {
  Topology world({0, 0, 1, 1, 2, 3});  // ranks 4 and 5: join slots
  world.set_link_costs(2, 10);
  const std::vector<std::string> hosts{"a", "a", "b", "b", "", ""};
  std::vector<char> present{1, 1, 1, 1, 0, 0};
  std::vector<std::string> joined = hosts;
  joined[4] = "b";
  present[4] = 1;
  const Topology on_b = with_joiner(world, joined, present, 4, "b");
  EXPECT_EQ(on_b.island_of_ranks(), (std::vector<int>{0, 0, 1, 1, 1, 2}));
  EXPECT_EQ(on_b.link_cost(LinkClass::CrossIsland), 10);
  joined[4] = "c";
  EXPECT_EQ(with_joiner(world, joined, present, 4, "c").island_of_ranks(), (std::vector<int>{0, 0, 1, 1, 2, 3}))
      << "a new host: still an island of its own";
  present[2] = present[3] = 0;  // host b's ranks gone: a joiner there is alone
  joined[4] = "b";
  EXPECT_EQ(with_joiner(world, joined, present, 4, "b").island_of_ranks(), (std::vector<int>{0, 0, 1, 1, 2, 3}));
  test::expect_error([&] { with_joiner(world, hosts, present, 6, "a"); }, ErrorKind::Internal, {"joiner 6"});
  test::expect_error([&] { with_joiner(world, {"a"}, present, 4, "a"); }, ErrorKind::Internal, {"1 hosts"});
}

// Every single loss of a placement with every expert on two islands: the
// survivors' placement, renumbered, is valid on the members and serves each
// expert from the same world ranks as before the renumbering.
TEST(Survivors, EverySingleLossOfARedundantPlacementRenumbersToAValidOne) {
  const Topology topology({0, 0, 1, 1});
  const routing::RoutingStats stats = test_stats::hot_expert(2, 3);
  const Placement two = add_island_redundancy(shuffled(4, 2, 4, 5), stats, topology, 2);
  for (int lost = 0; lost < 4; ++lost) {
    const LossPlan plan = drop_lost_ranks(two, {lost});
    EXPECT_TRUE(plan.orphans.empty()) << "rank " << lost;
    std::vector<int> members;
    for (int r = 0; r < 4; ++r)
      if (r != lost) members.push_back(r);
    const Placement q = placement_on_members(adopt_orphans(plan, stats, {lost}), members);
    q.validate("after losing rank " + std::to_string(lost));
    for (int l = 0; l < 2; ++l)
      for (int e = 0; e < 4; ++e) {
        std::vector<int> world;
        for (int r : q.replicas(l, e)) world.push_back(members[std::size_t(r)]);
        EXPECT_EQ(world, plan.survivors.replicas(l, e)) << "lost " << lost << " layer " << l << " expert " << e;
      }
    EXPECT_EQ(topology_on_members(topology, members).islands(), 2);
  }
}

// The plan the daemon's survivors serve with: with every expert on two
// islands nothing is loaded; without, each orphan goes to one survivor,
// spread by the placement's own loads, and that survivor alone loads it.
TEST(Survivors, APlanLoadsNothingWhenEveryExpertHasACopyLeft) {
  const Topology topology({0, 0, 1, 1});
  const Placement two = add_island_redundancy(shuffled(4, 2, 4, 5), test_stats::hot_expert(2, 3), topology, 2);
  for (int lost = 0; lost < 4; ++lost) {
    const SurvivorsPlan plan = plan_for_survivors(two, {lost});
    EXPECT_EQ(plan.members.size(), 3u);
    for (const auto& loads : plan.to_load) EXPECT_TRUE(loads.empty()) << "lost " << lost;
    EXPECT_EQ(plan.to_load.size(), 3u);
    plan.placement.validate("lost " + std::to_string(lost));
  }
}

TEST(Survivors, APlanSpreadsTheOrphansOverTheSurvivors) {
  const Placement p = contiguous(4, 1, 8);  // rank r holds experts 2r and 2r + 1
  const SurvivorsPlan plan = plan_for_survivors(p, {2});
  EXPECT_EQ(plan.members, (std::vector<int>{0, 1, 3}));
  using Loads = std::vector<std::vector<std::pair<int, int>>>;
  EXPECT_EQ(plan.to_load, (Loads{{{0, 4}}, {{0, 5}}, {}}));
  EXPECT_EQ(plan.placement.replicas(0, 4), std::vector<int>{0});
  EXPECT_EQ(plan.placement.replicas(0, 5), std::vector<int>{1});
  EXPECT_EQ(plan.placement.replicas(0, 6), std::vector<int>{2});  // world rank 3's, renumbered
  plan.placement.validate("lost rank 2");
  // Two lost at once: four orphans over two survivors, two each.
  const SurvivorsPlan two = plan_for_survivors(p, {1, 3});
  EXPECT_EQ(two.members, (std::vector<int>{0, 2}));
  EXPECT_EQ(two.to_load[0].size(), 2u);
  EXPECT_EQ(two.to_load[1].size(), 2u);
  for (std::size_t r = 0; r < two.to_load.size(); ++r)
    for (const auto& [l, e] : two.to_load[r]) EXPECT_EQ(two.placement.replicas(l, e), std::vector<int>{int(r)});
  two.placement.validate("lost ranks 1 and 3");
  test::expect_error([&] { plan_for_survivors(p, {0, 1, 2, 3}); }, ErrorKind::Runtime, {"every rank"});
}

TEST(Newcomers, JoinEmptyAndTakeTheMeanShareFromTheFullestRanks) {
  const Placement p = contiguous(3, 2, 6);  // 4 slots per rank: rank r holds experts 2r, 2r + 1 of each layer
  const Placement grown = with_newcomers(p, 1);
  ASSERT_EQ(grown.ranks(), 4);
  EXPECT_EQ(grown.slots_on(3), 0);
  for (int l = 0; l < 2; ++l)
    for (int e = 0; e < 6; ++e) EXPECT_EQ(grown.replicas(l, e), p.replicas(l, e));
  const std::vector<Move> moves = moves_to_newcomers(grown, {3});
  // 12 slots over 4 ranks: 3 for the newcomer, one from each rank in turn,
  // alternating layers (the one where it holds fewer first).
  const std::vector<Move> expected{{0, 0, 0, 3, 0, 0, 1, false, 0},
                                   {1, 2, 1, 3, 1, 0, 1, false, 0},
                                   {0, 4, 2, 3, 2, 0, 1, false, 0}};
  EXPECT_EQ(moves, expected);
  const Placement after = apply_moves(grown, moves);
  after.validate("the newcomer's moves");
  for (int r = 0; r < 4; ++r) EXPECT_EQ(after.slots_on(r), 3) << "rank " << r;
}

TEST(Newcomers, NothingMovesWhenAMoveWouldNotNarrowTheGap) {
  const Placement p = with_newcomers(contiguous(2, 1, 2), 1);  // one slot each, a newcomer: mean 0
  EXPECT_TRUE(moves_to_newcomers(p, {2}).empty());
  // A split expert is not taken apart: its shards stay.
  Placement split = contiguous(2, 1, 2);
  split.set_shards(0, 0, {0, 1});
  split.set_shards(0, 1, {1, 0});
  EXPECT_TRUE(moves_to_newcomers(with_newcomers(split, 1), {2}).empty());
  test::expect_error([&] { moves_to_newcomers(p, {0}); }, ErrorKind::Internal, {"not a newcomer"});
}

}  // namespace
}  // namespace moed::placement
