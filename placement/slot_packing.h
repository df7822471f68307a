// Replicas and packing, the steps every balancing policy shares: how many
// slots each expert of a layer gets (replicas for hot experts, redundant
// slots), and which rank each slot goes to by load. The optimizer
// (placement/optimizer.h) composes them with the METIS partition.
#pragma once

#include <vector>

#include "placement/placement.h"

namespace moed::placement {

// One copy of an expert in one layer, with its share of the expert's load.
struct ExpertSlot {
  int expert;
  double load;
};

// The slots one layer may spend, over all ranks: ranks x slots_per_rank (when
// > 0), or experts + redundant (when >= 0). With neither, the replicas hot
// experts need (ceil(load / fair share), the fair share being load / ranks)
// plus one redundant slot per island. Setting both, a budget below one slot
// per expert, or one that cannot be spent without two replicas of an expert on
// one rank (more than experts x ranks) is a Usage error naming the numbers.
struct SlotBudget {
  int slots_per_rank = 0;   // per layer; 0: not set
  int redundant_slots = -1;  // beyond one per expert; -1: not set
};
int layer_slots(const SlotBudget& budget, const std::vector<double>& loads, int ranks, int islands);

// Slots per rank that hold `total` slots: the budget's slots_per_rank, else
// ceil(total / ranks) (a total not divisible by the ranks leaves some ranks
// one slot short).
int rank_capacity(const SlotBudget& budget, int total, int ranks);

// Exactly `total` slots of each expert of one layer, as DeepSeek's EPLB
// replicates: one each, then one at a time to the expert with the most load
// per slot (ties: the lower expert), never more than `ranks` of one expert.
// `total` must lie in [experts, experts x ranks].
std::vector<int> replica_counts(const std::vector<double>& loads, int ranks, int total);

// One layer's slots: replicas[e] of expert e, each with an even share of its load.
std::vector<ExpertSlot> make_slots(const std::vector<double>& loads, const std::vector<int>& replicas);

// Slots onto `ranks` by load: heaviest first into the lightest rank that has
// room and does not hold that expert yet (ties: the lower rank), then pairwise
// swaps (or moves into free room) between the most loaded rank and another
// while that lowers the pair's maximum: greedy packing alone leaves a few
// percent of imbalance when every rank must take the same number of slots.
void pack_by_load(const std::vector<ExpertSlot>& slots, const std::vector<int>& ranks, int capacity,
                  int layer, Placement& p);

}  // namespace moed::placement
