// Replica counts on hand cases: hot experts, redundant slots one by one,
// never more replicas than ranks, trimming to the slots there are.
#include "placement/slot_packing.h"

#include <gtest/gtest.h>

#include <vector>

namespace moed::placement {
namespace {

TEST(ReplicaCounts, NoHotExpertMeansOneSlotEach) {
  // Fair share 8 / 2 = 4; no expert above it.
  EXPECT_EQ(replica_counts({1, 1, 3, 3}, 2, 0), (std::vector<int>{1, 1, 1, 1}));
  // Exactly the fair share is not hot: 2 of 4 on 2 ranks.
  EXPECT_EQ(replica_counts({2, 1, 1}, 2, 0), (std::vector<int>{1, 1, 1}));
  // No load at all: one slot each, redundant slots or not.
  EXPECT_EQ(replica_counts({0, 0, 0}, 2, 0, 3), (std::vector<int>{1, 1, 1}));
}

TEST(ReplicaCounts, HotExpertGetsCeilOfLoadOverFairShare) {
  // Total 8 on 4 ranks: fair share 2; expert 0 carries 5 = 2.5 shares -> 3 slots.
  EXPECT_EQ(replica_counts({5, 1, 1, 1}, 4, 0), (std::vector<int>{3, 1, 1, 1}));
  // 4 = exactly 2 shares of 2 -> 2 slots (no rounding up past an exact multiple).
  EXPECT_EQ(replica_counts({4, 2, 1, 1}, 4, 0), (std::vector<int>{2, 1, 1, 1}));
  // All the load on one expert: 4 shares on 4 ranks -> a slot on every rank.
  EXPECT_EQ(replica_counts({9, 0, 0, 0}, 4, 0), (std::vector<int>{4, 1, 1, 1}));
}

struct RedundantCase {
  int redundant;
  std::vector<int> expected;
};
class ReplicaCountsRedundant : public testing::TestWithParam<RedundantCase> {};

// Loads {8, 3, 2, 1} on 4 ranks: fair share 14 / 4 = 3.5, expert 0 is 2.29
// shares -> 3 slots. Load per slot then 2.67, 3, 2, 1; each redundant slot
// goes to the largest:
//   +1: expert 1 (3)    -> {3,2,1,1}; per slot 2.67, 1.5, 2, 1
//   +2: expert 0 (2.67) -> {4,2,1,1}; per slot 2, 1.5, 2, 1 (expert 0 now on every rank)
//   +3: expert 2 (2)    -> {4,2,2,1}; per slot -, 1.5, 1, 1
//   +4: expert 1 (1.5)  -> {4,3,2,1}
TEST_P(ReplicaCountsRedundant, GoToMostLoadPerSlotOneByOne) {
  EXPECT_EQ(replica_counts({8, 3, 2, 1}, 4, 0, GetParam().redundant), GetParam().expected);
}
INSTANTIATE_TEST_SUITE_P(Steps, ReplicaCountsRedundant,
                         testing::Values(RedundantCase{0, {3, 1, 1, 1}}, RedundantCase{1, {3, 2, 1, 1}},
                                         RedundantCase{2, {4, 2, 1, 1}}, RedundantCase{3, {4, 2, 2, 1}},
                                         RedundantCase{4, {4, 3, 2, 1}}));

TEST(ReplicaCounts, NeverMoreReplicasThanRanks) {
  // Fair share 6 on 2 ranks: expert 0 (10) -> 2 = ranks. The redundant slots
  // can only go to experts below 2 slots: {2,2,2}, then none is left.
  EXPECT_EQ(replica_counts({10, 1, 1}, 2, 0, 5), (std::vector<int>{2, 2, 2}));
  for (int redundant : {0, 1, 7, 50}) {
    std::vector<int> r = replica_counts({40, 30, 1, 1, 1, 1, 1, 1}, 3, 0, redundant);
    for (int n : r) {
      EXPECT_GE(n, 1);
      EXPECT_LE(n, 3);
    }
  }
}

TEST(ReplicaCounts, TrimmingDropsLeastNeededReplicaFirst) {
  // {8,3,2,1} with 4 redundant: {4,3,2,1} = 10 slots. Into 4 ranks x 2 = 8:
  // dropping one slot of e leaves load/(r-1) per slot: e0 8/3 = 2.67,
  // e1 3/2 = 1.5, e2 2/1 = 2 -> drop e1's: {4,2,2,1} = 9; then e0 2.67,
  // e1 3, e2 2 -> drop e2's: {4,2,1,1} = 8.
  EXPECT_EQ(replica_counts({8, 3, 2, 1}, 4, 2, 4), (std::vector<int>{4, 2, 1, 1}));
  // Into 4 x 1 = 4: on to e0 (2.67) {3,2,1,1}, e1 (3 vs e0 4) {3,1,1,1},
  // then e0 alone {2,1,1,1}, {1,1,1,1}.
  EXPECT_EQ(replica_counts({8, 3, 2, 1}, 4, 1, 4), (std::vector<int>{1, 1, 1, 1}));
  // Room enough: nothing trimmed.
  EXPECT_EQ(replica_counts({8, 3, 2, 1}, 4, 3, 4), (std::vector<int>{4, 3, 2, 1}));
  // Hot replicas are trimmed too: {3,1,1,1} = 6 slots into 4 x 1 = 4.
  EXPECT_EQ(replica_counts({5, 1, 1, 1}, 4, 1), (std::vector<int>{1, 1, 1, 1}));
}

}  // namespace
}  // namespace moed::placement
