// Split experts in placements: the file syntax ({shards = [...]}, and
// {shards = [[...], [...]]} for a split expert held in several copies) and
// its round trip, each refusal naming the file, line, layer and expert, the
// run's rules (S divides [experts].ffn_chunks, each copy on one island), and
// migration's moves of shards (placement_diff.h).
#include <gtest/gtest.h>

#include <string>
#include <tuple>
#include <vector>

#include "common/error.h"
#include "placement/cost_model.h"
#include "placement/placement.h"
#include "placement/placement_diff.h"
#include "placement/placement_file.h"
#include "placement/shard_rules.h"
#include "tests/unit/test_support.h"

namespace moed::placement {
namespace {

using test::expect_error;

const std::string kHeader = "format = \"moed-placement-v1\"\nepoch = 1\nranks = 4\nlayers = 1\nexperts = 4\n";

TEST(Shards, TheFileSyntaxParsesAndRoundTrips) {
  const Placement p = parse_placement(kHeader + "[[layer]]\nslots = [[0], {shards = [2, 3]}, [1, 2], [3]]\n", "s.toml");
  EXPECT_EQ(p.shards(0, 1), 2);
  EXPECT_EQ(p.replicas(0, 1), (std::vector<int>{2, 3}));
  EXPECT_EQ(p.shard_on(0, 1, 3), 1);
  EXPECT_EQ(p.shard_on(0, 1, 2), 0);
  EXPECT_EQ(p.shard_on(0, 1, 0), -1);
  EXPECT_EQ(p.shards(0, 2), 1) << "two ranks in an array are replicas, not shards";
  EXPECT_EQ(p.shard_on(0, 2, 2), 0);
  EXPECT_TRUE(p.any_sharded());
  EXPECT_EQ(parse_placement(format_placement(p), "again.toml"), p);
  EXPECT_NE(format_placement(p).find("{shards = [2, 3]}"), std::string::npos);
  Placement whole = p;
  whole.set_replicas(0, 1, {2, 3});
  EXPECT_FALSE(whole.any_sharded());
  EXPECT_NE(whole, p) << "replicas on the same ranks are another placement";
}

TEST(Shards, ShardOrderIsKept) {
  Placement p = contiguous(4, 2, 4);
  p.set_shards(1, 2, {3, 0, 2, 1});
  const Placement back = parse_placement(format_placement(p), "order.toml");
  EXPECT_EQ(back.replicas(1, 2), (std::vector<int>{3, 0, 2, 1}));
  EXPECT_EQ(back.shard_on(1, 2, 2), 2);
  EXPECT_EQ(back.slots_on(3), 3) << "a shard is a slot";
}

// A split expert can also be replicated: copies of S shards, each on its island.
TEST(Shards, ASplitExpertHeldInCopiesParsesAndRoundTrips) {
  const std::string text = kHeader + "[[layer]]\nslots = [[0], {shards = [[1, 0], [3, 2]]}, [1, 2], [3]]\n";
  const Placement p = parse_placement(text, "c.toml");
  EXPECT_EQ(p.shards(0, 1), 2);
  EXPECT_EQ(p.copies(0, 1), 2);
  EXPECT_EQ(p.replicas(0, 1), (std::vector<int>{1, 0, 3, 2}));
  EXPECT_EQ(std::vector<int>(p.copy(0, 1, 1).begin(), p.copy(0, 1, 1).end()), (std::vector<int>{3, 2}));
  EXPECT_EQ(p.shard_on(0, 1, 3), 0);
  EXPECT_EQ(p.shard_on(0, 1, 0), 1);
  EXPECT_EQ(p.copy_on(0, 1, 2), 1);
  EXPECT_EQ(p.copy_on(0, 1, 1), 0);
  EXPECT_EQ(p.copies(0, 2), 2) << "replicas are the copies of a whole expert";
  EXPECT_EQ(p.copy_on(0, 2, 2), 1);
  EXPECT_EQ(format_placement(p).find("{shards = [[1, 0], [3, 2]]}") != std::string::npos, true) << format_placement(p);
  EXPECT_EQ(parse_placement(format_placement(p), "again.toml"), p);
  // Islands: each copy on its own is the rule, not the expert as a whole.
  check_shards(p, 4, Topology({0, 0, 1, 1}), "c.toml");
  expect_error([&] { check_shards(p, 4, Topology({0, 1, 0, 1}), "c.toml"); }, ErrorKind::Input,
               {"c.toml", "layer 0 expert 1", "shard 0 of copy 0 is on rank 1 (island 1)", "rank 0 (island 0)"});
  // Copies of unequal size, or a rank in two copies, are refused.
  expect_error([&] { parse_placement(kHeader + "[[layer]]\nslots = [[0], {shards = [[1, 0], [3]]}, [1], [3]]\n", "u.toml"); },
               ErrorKind::Input, {"u.toml", "layer 0 expert 1", "each copy", "2 shard ranks", "(line 7)"});
  expect_error([&] { parse_placement(kHeader + "[[layer]]\nslots = [[0], {shards = [[1, 0], 3]}, [1], [3]]\n", "u.toml"); },
               ErrorKind::Input, {"u.toml", "layer 0 expert 1", "each copy"});
  expect_error([&] { parse_placement(kHeader + "[[layer]]\nslots = [[0], {shards = [[1, 0], [0, 2]]}, [1], [3]]\n", "u.toml"); },
               ErrorKind::Input, {"u.toml", "layer 0 expert 1 lists rank 0 twice"});
  expect_error([&] { parse_placement(kHeader + "[[layer]]\nslots = [[0], {shards = [[1], [2]]}, [1], [3]]\n", "u.toml"); },
               ErrorKind::Input, {"u.toml", "layer 0 expert 1", "at least 2 shards"});
}

class ShardFileRefuses : public ::testing::TestWithParam<std::tuple<std::string, std::vector<std::string>>> {};

TEST_P(ShardFileRefuses, NamingTheLineLayerAndExpert) {
  const auto& [slots, parts] = GetParam();
  const std::string text = kHeader + "[[layer]]\nslots = [[0],\n  " + slots + ", [1], [3]]\n";
  std::vector<std::string> want{"bad.toml"};
  want.insert(want.end(), parts.begin(), parts.end());
  expect_error([&] { parse_placement(text, "bad.toml"); }, ErrorKind::Input, want);
}

INSTANTIATE_TEST_SUITE_P(
    Cases, ShardFileRefuses,
    ::testing::Values(
        std::tuple{"{shards = [2]}", std::vector<std::string>{"(line 8)", "layer 0 expert 1", "at least 2 shards"}},
        std::tuple{"{shards = []}", std::vector<std::string>{"(line 8)", "layer 0 expert 1", "at least 2 shards"}},
        std::tuple{"{shards = [2, 2]}",
                   std::vector<std::string>{"layer 0 expert 1 lists rank 2 twice", "at most one shard"}},
        std::tuple{"{shards = [2, 7]}", std::vector<std::string>{"(line 8)", "layer 0 expert 1", "rank 7"}},
        std::tuple{"{shards = [2, 3], extra = 1}",
                   std::vector<std::string>{"(line 8)", "layer 0 expert 1", "{shards = [2, 3]}"}},
        std::tuple{"{ranks = [2, 3]}", std::vector<std::string>{"(line 8)", "layer 0 expert 1", "{shards = [2, 3]}"}},
        std::tuple{"{shards = [2, 1.5]}", std::vector<std::string>{"(line 8)", "ranks must be integers"}}));

TEST(Shards, RunRulesNameTheLayerExpertAndWhy) {
  const Topology two_islands({0, 0, 1, 1});
  Placement p = contiguous(4, 2, 4);
  p.set_shards(1, 3, {2, 3});
  check_shards(p, 2, two_islands, "p.toml");
  check_shards(p, 8, two_islands, "p.toml");
  expect_error([&] { check_shards(p, 3, two_islands, "p.toml"); }, ErrorKind::Input,
               {"p.toml", "layer 1 expert 3", "2 shards", "[experts].ffn_chunks = 3"});
  expect_error([&] { check_shards(p, 1, two_islands, "p.toml"); }, ErrorKind::Input,
               {"layer 1 expert 3", "[experts].ffn_chunks = 1"});
  p.set_shards(0, 0, {1, 2});
  expect_error([&] { check_shards(p, 4, two_islands, "p.toml"); }, ErrorKind::Input,
               {"p.toml", "layer 0 expert 0", "rank 1 (island 0)", "rank 2 (island 1)", "share an island"});
  check_shards(p, 4, Topology({0, 0, 0, 0}), "p.toml");
}

TEST(Shards, AShardMovesFromItsHolderKeepingItsIndex) {
  Placement current = contiguous(4, 1, 4);
  current.set_shards(0, 1, {0, 1});
  Placement next = current;
  next.set_shards(0, 1, {0, 3});
  const std::vector<Move> m = moves(current, next);
  ASSERT_EQ(m, (std::vector<Move>{{0, 1, 1, 3, 1, 1, 2}}));
  EXPECT_EQ(apply_moves(current, m), next);
  EXPECT_EQ(apply_moves(current, m).shards(0, 1), 2);
  EXPECT_NE(describe_moves(m).find("shard 1 of 2: rank 1 -> rank 3"), std::string::npos) << describe_moves(m);
  // Both shards move: two moves, each applied alone still a valid split.
  next.set_shards(0, 1, {2, 3});
  const std::vector<Move> both = moves(current, next);
  ASSERT_EQ(both.size(), 2u);
  for (const Move& one : both) apply_moves(current, {one}).validate("one move");
  EXPECT_EQ(apply_moves(current, both), next);
}

TEST(Shards, MigrationRefusesToReSplitOrStackShards) {
  Placement current = contiguous(4, 1, 4);
  current.set_shards(0, 1, {0, 1});
  Placement whole = current;
  whole.set_replicas(0, 1, {0});
  expect_error([&] { moves(current, whole); }, ErrorKind::Input,
               {"layer 0 expert 1", "2 shard(s) now and 1", "does not re-split"});
  Placement four = current;
  four.set_shards(0, 1, {0, 1, 2, 3});
  expect_error([&] { moves(current, four); }, ErrorKind::Input, {"2 shard(s) now and 4", "does not re-split or merge"});
  Placement swapped = current;
  swapped.set_shards(0, 1, {1, 0});
  expect_error([&] { moves(current, swapped); }, ErrorKind::Input,
               {"layer 0 expert 1", "shard 0 would move to rank 1, which holds shard 1"});
  // A move that is not a shard's from its holder is an internal error.
  expect_error([&] { apply_moves(current, {{0, 1, 0, 3, 0, 1, 2}}); }, ErrorKind::Internal, {"shard 1 of 2"});
  expect_error([&] { apply_moves(current, {{0, 1, 0, 3, 0}}); }, ErrorKind::Internal, {"split into 2"});
}

// Copies of a split expert: each shard of each copy moves from its holder;
// a change in the number of copies is refused like a re-split.
TEST(Shards, ShardsOfEachCopyMoveAndCopiesStayAsTheyAre) {
  Placement current = contiguous(8, 1, 8);
  current.set_shards(0, 1, {0, 1, 4, 5}, 2);
  Placement next = current;
  next.set_shards(0, 1, {0, 1, 6, 5}, 2);  // copy 1's shard 0: rank 4 -> 6
  const std::vector<Move> m = moves(current, next);
  ASSERT_EQ(m, (std::vector<Move>{{0, 1, 4, 6, 4, 0, 2, false, 1}}));
  EXPECT_EQ(apply_moves(current, m), next);
  EXPECT_NE(describe_moves(m).find("shard 0 of 2 of copy 1: rank 4 -> rank 6"), std::string::npos)
      << describe_moves(m);
  Placement fewer = current;
  fewer.set_shards(0, 1, {0, 1}, 2);
  expect_error([&] { moves(current, fewer); }, ErrorKind::Input,
               {"layer 0 expert 1", "held 2 and 1 time(s)", "nor add or drop its copies"});
  // A shard move that names the wrong copy is an internal error.
  expect_error([&] { apply_moves(current, {{0, 1, 4, 6, 4, 0, 2, false, 0}}); }, ErrorKind::Internal,
               {"shard 0 of 2 (copy 0)"});
  // A whole expert replicated on both islands is cut into a copy on each:
  // every shard is cut from the holder inside its copy, a holder outside released.
  Placement whole = contiguous(8, 1, 8);
  whole.set_replicas(0, 1, {0, 4, 7});
  Placement split = whole;
  split.set_shards(0, 1, {0, 1, 5, 4}, 2);
  const std::vector<Move> cut = moves(whole, split);
  ASSERT_EQ(cut, (std::vector<Move>{{0, 1, -1, -1, 7, 0, 2, true, 0},
                                    {0, 1, 0, 0, -1, 0, 2, true, 0},
                                    {0, 1, 0, 1, -1, 1, 2, true, 0},
                                    {0, 1, 4, 4, -1, 1, 2, true, 1},
                                    {0, 1, 4, 5, -1, 0, 2, true, 1}}));
  EXPECT_EQ(apply_moves(whole, cut), split);
  expect_error([&] { apply_moves(whole, {cut[0], cut[1], cut[2], cut[3]}); }, ErrorKind::Internal,
               {"shard 0 of 2 is missing (copy 1"});
  // Two copies' shards cost two half-experts where no whole copy was.
  EXPECT_EQ(move_cost(whole, split, 1000).slots, 2u);
  EXPECT_EQ(move_cost(whole, split, 1000).bytes, 1000u);
}

// A whole expert that the new placement splits is cut into its shards: each
// from a holder (its own rank where it holds one), the other holders
// released, all applied together.
TEST(Shards, AWholeExpertIsCutIntoItsShards) {
  const Placement whole = contiguous(4, 1, 4);  // expert 1 on rank 1
  Placement split = whole;
  split.set_shards(0, 1, {0, 1});
  const std::vector<Move> m = moves(whole, split);
  ASSERT_EQ(m, (std::vector<Move>{{0, 1, 1, 0, -1, 0, 2, true}, {0, 1, 1, 1, -1, 1, 2, true}}));
  EXPECT_EQ(apply_moves(whole, m), split);
  EXPECT_NE(describe_moves(m).find("split into 2 shards: shard 1 on rank 1 (cut from rank 1)"), std::string::npos)
      << describe_moves(m);
  // Replicated on ranks 1 and 2, split onto ranks 3 and 2: rank 2 keeps shard
  // 1 cut from its own copy and cuts shard 0 for rank 3 (a holder inside the
  // new copy is the source), rank 1 is released.
  Placement replicated = whole;
  replicated.set_replicas(0, 1, {1, 2});
  Placement elsewhere = whole;
  elsewhere.set_shards(0, 1, {3, 2});
  const std::vector<Move> r = moves(replicated, elsewhere);
  ASSERT_EQ(r, (std::vector<Move>{{0, 1, -1, -1, 1, 0, 2, true}, {0, 1, 2, 2, -1, 1, 2, true},
                                  {0, 1, 2, 3, -1, 0, 2, true}}));
  EXPECT_EQ(apply_moves(replicated, r), elsewhere);
  EXPECT_NE(describe_moves(r).find("split into 2 shards: releases rank 1"), std::string::npos) << describe_moves(r);
  // A cut applies whole: a missing shard or a holder neither kept nor released is an internal error.
  expect_error([&] { apply_moves(replicated, {r[0], r[1]}); }, ErrorKind::Internal, {"shard 0 of 2 is missing"});
  expect_error([&] { apply_moves(replicated, {r[1], r[2]}); }, ErrorKind::Internal,
               {"rank 1 would keep its whole copy"});
  expect_error([&] { apply_moves(split, m); }, ErrorKind::Internal, {"split already"});
  // What it costs: shard 0 to rank 3 is half an expert; rank 2 cuts its own.
  EXPECT_EQ(move_cost(replicated, elsewhere, 1000).slots, 1u);
  EXPECT_EQ(move_cost(replicated, elsewhere, 1000).bytes, 500u);
}

TEST(Shards, RelabellingKeepsTheSplit) {
  Placement current = contiguous(4, 1, 4);
  current.set_shards(0, 1, {0, 1});
  Placement next = contiguous(4, 1, 4);
  next.set_shards(0, 1, {2, 3});
  // next is current with islands swapped: relabelled, nothing moves.
  for (int e : {0, 2, 3}) next.set_replicas(0, e, {(current.replicas(0, e)[0] + 2) % 4});
  const Placement relabelled = relabel_to_minimise_moves(current, next, Topology({0, 0, 1, 1}));
  EXPECT_EQ(relabelled.shards(0, 1), 2);
  EXPECT_TRUE(moves(current, relabelled).empty()) << describe_moves(moves(current, relabelled));
}

}  // namespace
}  // namespace moed::placement
