// The slot budget and replica counts on hand cases: every slot of the budget
// spent, one at a time to the most load per slot, never more replicas than
// ranks; budgets that cannot hold or cannot be spent refused; and packing
// that never puts two replicas of an expert on one rank.
#include "placement/slot_packing.h"

#include <gtest/gtest.h>

#include <numeric>
#include <set>
#include <vector>

#include "common/error.h"
#include "tests/unit/test_support.h"

namespace moed::placement {
namespace {

int sum(const std::vector<int>& v) { return std::accumulate(v.begin(), v.end(), 0); }

struct CountsCase {
  std::vector<double> loads;
  int ranks, total;
  std::vector<int> expected;
};
class ReplicaCounts : public testing::TestWithParam<CountsCase> {};

// Loads {8, 3, 2, 1} on 4 ranks; each slot beyond one per expert goes to the
// most load per slot: 5th slot e0 (8), 6th e0 (4 vs 3), 7th e1 (3 vs 2.67),
// 8th e0 (2.67), 9th e2 (2; e0 is on every rank already).
TEST_P(ReplicaCounts, SpendExactlyTheTotalOnTheMostLoadPerSlot) {
  const CountsCase& c = GetParam();
  std::vector<int> r = replica_counts(c.loads, c.ranks, c.total);
  EXPECT_EQ(r, c.expected);
  EXPECT_EQ(sum(r), c.total);
}
INSTANTIATE_TEST_SUITE_P(
    Steps, ReplicaCounts,
    testing::Values(CountsCase{{8, 3, 2, 1}, 4, 4, {1, 1, 1, 1}}, CountsCase{{8, 3, 2, 1}, 4, 5, {2, 1, 1, 1}},
                    CountsCase{{8, 3, 2, 1}, 4, 6, {3, 1, 1, 1}}, CountsCase{{8, 3, 2, 1}, 4, 7, {3, 2, 1, 1}},
                    CountsCase{{8, 3, 2, 1}, 4, 8, {4, 2, 1, 1}}, CountsCase{{8, 3, 2, 1}, 4, 9, {4, 2, 2, 1}},
                    // Every expert on every rank.
                    CountsCase{{8, 3, 2, 1}, 4, 16, {4, 4, 4, 4}},
                    // All the load on one expert: it reaches every rank, then
                    // the unloaded experts take the rest (every slot is spent).
                    CountsCase{{9, 0, 0}, 2, 5, {2, 2, 1}},
                    CountsCase{{0, 0, 0}, 2, 5, {2, 2, 1}}));

TEST(ReplicaCountsLimits, NeverMoreReplicasThanRanksNorOutsideTheBudget) {
  for (int total = 8; total <= 24; ++total) {
    std::vector<int> r = replica_counts({40, 30, 1, 1, 1, 1, 1, 1}, 3, total);
    EXPECT_EQ(sum(r), total);
    for (int n : r) {
      EXPECT_GE(n, 1);
      EXPECT_LE(n, 3);
    }
  }
  EXPECT_THROW(replica_counts({1, 1, 1}, 2, 2), Error);  // fewer slots than experts
  EXPECT_THROW(replica_counts({1, 1, 1}, 2, 7), Error);  // more than experts x ranks
}

struct BudgetCase {
  int slots_per_rank, redundant;
  int experts, ranks, islands;
  int total, capacity;
};
class LayerSlots : public testing::TestWithParam<BudgetCase> {};

TEST_P(LayerSlots, FromSlotsPerRankOrRedundantSlots) {
  const BudgetCase& c = GetParam();
  std::vector<double> loads(std::size_t(c.experts), 1.0);
  const SlotBudget budget{c.slots_per_rank, c.redundant};
  const int total = layer_slots(budget, loads, c.ranks, c.islands);
  EXPECT_EQ(total, c.total);
  EXPECT_EQ(rank_capacity(budget, total, c.ranks), c.capacity);
}
INSTANTIATE_TEST_SUITE_P(
    Budgets, LayerSlots,
    testing::Values(
        // Mixtral on 2 islands x 2 ranks: 8, 10, 12, 16 slots per layer.
        BudgetCase{2, -1, 8, 4, 2, 8, 2}, BudgetCase{0, 2, 8, 4, 2, 10, 3}, BudgetCase{3, -1, 8, 4, 2, 12, 3},
        BudgetCase{0, 4, 8, 4, 2, 12, 3}, BudgetCase{4, -1, 8, 4, 2, 16, 4},
        // Not divisible by the ranks: some ranks hold one slot fewer.
        BudgetCase{0, 1, 8, 4, 2, 9, 3}, BudgetCase{0, 0, 7, 4, 2, 7, 2},
        // The largest budgets that can be spent: every expert on every rank.
        BudgetCase{8, -1, 8, 4, 2, 32, 8}, BudgetCase{0, 24, 8, 4, 2, 32, 8},
        // Neither: even loads need no replicas, plus one slot per island.
        BudgetCase{0, -1, 8, 4, 2, 10, 3}, BudgetCase{0, -1, 8, 8, 8, 16, 2}));

TEST(LayerSlotsDefault, HotExpertsReplicasPlusOnePerIsland) {
  // Fair share 14 / 4 = 3.5: expert 0 (8) needs ceil(2.29) = 3 slots; + 2 islands.
  EXPECT_EQ(layer_slots({}, {8, 3, 2, 1}, 4, 2), 3 + 3 + 2);
  // Capped where every expert is on every rank.
  EXPECT_EQ(layer_slots({}, {8, 3}, 2, 2), 4);
}

struct RefusedCase {
  int slots_per_rank, redundant;
  std::vector<std::string> words;
};
class LayerSlotsRefused : public testing::TestWithParam<RefusedCase> {};

TEST_P(LayerSlotsRefused, IsUsageErrorNamingTheNumbers) {
  const RefusedCase& c = GetParam();
  test::expect_error([&] { layer_slots({c.slots_per_rank, c.redundant}, std::vector<double>(8, 1.0), 4, 2); },
                     ErrorKind::Usage, c.words);
}
INSTANTIATE_TEST_SUITE_P(
    Budgets, LayerSlotsRefused,
    testing::Values(RefusedCase{1, -1, {"1 slots per rank", "8 experts", "4 ranks", "at least 2"}},
                    RefusedCase{9, -1, {"9 slots per rank", "8 experts"}},
                    RefusedCase{0, 25, {"25 redundant slots", "at most 24"}},
                    RefusedCase{3, 4, {"not both"}}));

// Packing keeps the capacity, places every slot, and never two replicas of
// one expert on a rank, even when uneven replica loads put the last replica
// of an expert where only ranks holding it have room.
TEST(PackByLoad, EverySlotPlacedNoRankHoldsAnExpertTwice) {
  struct Case {
    std::vector<ExpertSlot> slots;
    int ranks, capacity;
  };
  for (const Case& c : {Case{{{0, 5}, {0, 1}, {1, 4}, {2, 3}}, 2, 2},
                        Case{{{0, 9}, {1, 2}, {2, 2}, {0, 0.5}, {3, 1}, {1, 1}}, 3, 2},
                        Case{{{0, 3}, {0, 3}, {0, 3}, {1, 2}, {2, 2}, {3, 1}, {1, 1}, {2, 1}}, 4, 2}}) {
    Placement p(c.ranks, 1, 4);
    std::vector<int> ranks(std::size_t(c.ranks));
    std::iota(ranks.begin(), ranks.end(), 0);
    pack_by_load(c.slots, ranks, c.capacity, 0, p);
    std::vector<int> copies(4, 0);
    for (const ExpertSlot& s : c.slots) ++copies[std::size_t(s.expert)];
    for (int e = 0; e < 4; ++e) {
      const std::vector<int>& held = p.replicas(0, e);
      EXPECT_EQ(int(held.size()), copies[std::size_t(e)]) << "expert " << e;
      EXPECT_EQ(std::set<int>(held.begin(), held.end()).size(), held.size()) << "expert " << e;
    }
    for (int r = 0; r < c.ranks; ++r) EXPECT_LE(int(p.experts_on(0, r).size()), c.capacity);
  }
}

}  // namespace
}  // namespace moed::placement
