// Placement policies on routing statistics: the METIS partitioner and the
// baselines it is judged against. Pure and deterministic (seeded).
//
//  metis        per layer, a graph of expert slots (vertex weight: load;
//               edge weight: co-activation) cut by METIS into islands with
//               target weights by island size (load and slot count both
//               balanced), then inside each island slots go to ranks by load
//               (heaviest first into the lightest rank). With `affinity`,
//               each layer's islands are renamed to follow the previous
//               layer's (an assignment problem on next-layer affinity), so a
//               token's consecutive experts tend to share an island.
//  greedy-load  balance only: heaviest slot first into the lightest rank (as
//               DeepSeek's EPLB packs).
//  contiguous   expert e on rank e / ceil(E / R), the usual default.
//  round-robin  expert e on rank e mod R.
// metis and greedy-load give a hot expert replicas when its load exceeds a
// rank's fair share (the layer's load / R): ceil(load / fair share) slots,
// each taking an even share; METIS places them near their co-routed partners.
// Then, as DeepSeek's EPLB does with redundant experts, a few redundant slots
// per layer (default: one per island) go one by one to the expert with the
// most load per slot: with exactly E / R slots per rank, a skewed layer
// cannot balance (OLMoE's hottest expert, 2.7x the mean, plus the three
// coldest already make a rank 14% over the mean at 4 slots per rank).
//
// This header is the placement entry point: the steps live in
// slot_packing.h (replicas, packing by load), metis_partition.h (islands)
// and move_limit.h (limit_moves, for a budget of moves); replica_counts and
// limit_moves come with it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "placement/move_limit.h"
#include "placement/placement.h"
#include "placement/slot_packing.h"
#include "placement/topology.h"
#include "routing/routing_stats.h"

namespace moed::placement {

struct OptimizeOptions {
  std::string policy = "metis";
  // Slots per rank in each layer; 0: as few as the replicas need (at least
  // ceil(experts / ranks)). A bound too small for every expert is a Usage error.
  int slots_per_rank = 0;
  bool replicate = true;  // metis, greedy-load: replicas for hot experts
  int redundant_slots = -1;  // per layer, beyond the needed ones; -1: one per island
  bool affinity = false;  // metis: align consecutive layers' islands
  std::uint64_t seed = 1;
};

const std::vector<std::string>& optimizer_policy_names();

Placement optimize(const routing::RoutingStats& stats, const Topology& topology, const OptimizeOptions& options);

}  // namespace moed::placement
