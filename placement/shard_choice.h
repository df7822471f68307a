// The optimiser's choice to split a hot expert into shards instead of
// replicating it (placement.h; the bits do not change, kernels/cpu/expert_ffn.h).
//
// A replica costs a whole expert's memory on another rank; S shards share
// the expert's work (each computes F/S of it for every row) while the
// expert's weights are held once. The rule, per layer, hottest first, for an
// expert whose load exceeds `over_mean` times the layer's mean:
//   - replicated by the optimiser: its replicas become S shards on the
//     island holding most of them (its replicas there first, then that
//     island's ranks with the least expert memory in the layer), releasing
//     the other copies; or, with `per_island`, a copy of S shards on every
//     island that holds a replica (chosen the same way; an island with
//     fewer than S ranks loses its replica), so that tokens keep their
//     near copy and each copy's work is spread over S ranks;
//   - not replicated (a replica did not fit the slot budget): it is split
//     over its rank and the S - 1 ranks of its island with the least expert
//     memory.
// Either way every shard rank must stay within `slots_per_rank` (expert
// memory per rank per layer, in whole experts; a shard counts 1/S), and an
// island with fewer than S ranks keeps the expert as it was.
// Pure: unit-tested.
#pragma once

#include "placement/placement.h"
#include "placement/topology.h"
#include "routing/routing_stats.h"

namespace moed::placement {

struct ShardRule {
  double over_mean = 0;     // 0: never split
  int shards = 2;           // S: must divide the run's [experts].ffn_chunks
  double slots_per_rank = 0;  // memory budget per rank per layer, in experts; 0: none
  bool per_island = false;    // a replicated expert keeps a copy of S shards on each island of its replicas
};

Placement split_hot_experts(const Placement& p, const routing::RoutingStats& stats, const Topology& topology,
                            const ShardRule& rule);

// `next` with every expert that `current` splits split as there, on the same
// ranks: a migration moves shards but does not re-split an expert
// (placement_diff.h), so a re-optimisation from a placement with split
// experts keeps them as they are and places the rest.
Placement keep_splits(const Placement& current, Placement next);

}  // namespace moed::placement
