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

// Slots of each expert in one layer: 1, or ceil(load / fair share) for a hot
// expert, plus `redundant` slots to the experts with the most load per slot,
// trimmed (least needed first) to fit ranks x slots_per_rank.
std::vector<int> replica_counts(const std::vector<double>& loads, int ranks, int slots_per_rank,
                                int redundant = 0);

// One layer's slots: replicas[e] of expert e, each with an even share of its load.
std::vector<ExpertSlot> make_slots(const std::vector<double>& loads, const std::vector<int>& replicas);

// Slots per rank: `requested`, or with 0 as few as the replicas need (at
// least ceil(experts / ranks)). A request below that minimum is a Usage error.
int slots_per_rank_for(const std::vector<int>& replicas, int ranks, int requested, int experts);

// Slots onto `ranks` by load: heaviest first into the lightest rank that has
// room and does not hold that expert yet (ties: the lower rank), then pairwise
// swaps (or moves into free room) between the most loaded rank and another
// while that lowers the pair's maximum: greedy packing alone leaves a few
// percent of imbalance when every rank must take the same number of slots.
void pack_by_load(const std::vector<ExpertSlot>& slots, const std::vector<int>& ranks, int capacity,
                  int layer, Placement& p);

}  // namespace moed::placement
