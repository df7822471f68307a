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
// metis and greedy-load spend the same slots, the layer's budget (see
// layer_slots): one per expert, then, as DeepSeek's EPLB does with redundant
// experts, one at a time to the expert with the most load per slot. Without
// redundant slots a skewed layer cannot balance (OLMoE's hottest expert,
// 2.7x the mean, plus the three coldest already make a rank 14% over the mean
// at 4 slots per rank). METIS places the replicas near their co-routed
// partners, spread over islands; greedy-load only balances.
//
// This header is the placement entry point: the steps live in
// slot_packing.h (replicas, packing by load), metis_partition.h (islands)
// and move_limit.h (limit_moves, for a budget of moves); replica_counts and
// limit_moves come with it.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "common/name_table.h"
#include "placement/move_limit.h"
#include "placement/placement.h"
#include "placement/slot_packing.h"
#include "placement/topology.h"
#include "routing/routing_stats.h"

namespace moed::placement {

enum class OptimizerPolicy { metis, greedy_load, contiguous, round_robin };
inline constexpr auto kOptimizerPolicyNames = config::name_table<OptimizerPolicy>(
    {{OptimizerPolicy::metis, "metis"}, {OptimizerPolicy::greedy_load, "greedy-load"},
     {OptimizerPolicy::contiguous, "contiguous"}, {OptimizerPolicy::round_robin, "round-robin"}});
inline std::string_view name_of(OptimizerPolicy v) { return kOptimizerPolicyNames.name(v); }

struct OptimizeOptions {
  OptimizerPolicy policy = OptimizerPolicy::metis;
  // The slot budget of each layer (metis, greedy-load): slots_per_rank x
  // ranks, or experts + redundant_slots; at most one of the two. With
  // neither: the replicas hot experts need plus one slot per island. The
  // baselines place one slot per expert and only check that the budget holds
  // every expert. Every slot of the budget is spent; a budget that cannot
  // hold each expert once, or cannot be spent, is a Usage error.
  int slots_per_rank = 0;    // per layer; 0: not set
  int redundant_slots = -1;  // per layer, beyond one per expert; -1: not set
  bool replicate = true;     // metis, greedy-load: false = one slot per expert
  bool affinity = false;  // metis: align consecutive layers' islands
  std::uint64_t seed = 1;
};

Placement optimize(const routing::RoutingStats& stats, const Topology& topology, const OptimizeOptions& options);

}  // namespace moed::placement
