// The METIS step of the metis policy: one layer's slots cut into islands so
// that experts often chosen together (co-activation) share an island, with
// island loads balanced by island size. METIS's cut is then made feasible
// for packing and evened out by moves and swaps that lose the least
// co-activation.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "placement/slot_packing.h"
#include "placement/topology.h"
#include "routing/routing_stats.h"

namespace moed::placement {

// The experts of one layer whose replicas may share an island ("pooled"): the
// hottest `share` (rounded up) of those with more than one replica, by the
// slots' summed load (ties: the lower expert). The others keep their
// replicas spread, one island each as far as they go. A token whose home
// island lacks a pooled expert crosses to it and takes the least used of its
// replicas there, so pooled replicas absorb what the fitted routing did not
// foresee (on held-out Mixtral routing, one replica per island left each
// island's tokens with their own replica and its rank with their noise);
// spread ones keep tokens home. Pure.
std::vector<char> pooled_experts(const std::vector<ExpertSlot>& slots, const std::vector<int>& replicas,
                                 double share);
// The share metis pools is a trade-off, not a constant: pooling none keeps
// tokens home but leaves rank load to the fitted routing's foresight;
// pooling all evens load out and gives back cross-island copies. The
// optimiser chooses it from the routing it fits (choose_pooled_share,
// optimizer.h) or takes it from OptimizeOptions::pooled_share.

// How much of an expert's co-activation (its row of the layer's symmetric
// [experts x experts] matrix, 0 on the diagonal) falls on its strongest
// experts / islands - 1 partners: as many as fit on one island beside it.
// 0 when no partner fits (an island per expert) or the row is empty. Pure.
double coactivation_concentration(std::span<const double> row, int islands);
// metis never pools an expert whose concentration reaches this: its group
// can sit whole on one island, and a replica elsewhere then carries load off
// that island without splitting the group. Pooled, the replicas of a hot
// expert followed its group onto one island, and balance pushed the group's
// other experts off it: on the emulated cluster's topic workload (experts
// at 0.98) cross-island copies per token went from 0.52 to 0.73. Diffuse
// co-activation (Mixtral, 0.53-0.95; the synthetic OLMoE and DeepSeek-V3
// shapes, 0.85-0.90) stays pooled (docs/placement.md).
inline constexpr double kConcentratedShare = 0.95;

// How one layer's slots are cut into islands, beside the slots and the
// statistics.
struct IslandRules {
  int slots_per_rank = 0;     // the layer's slots a rank holds
  double pooled_share = 0.5;  // pooled_experts's share
  // Islands may carry this much more load per rank than the mean, after
  // METIS's cut and again once dispatch's shares are estimated.
  double island_tolerance = 0.02;
  // Group-limited routing (DeepSeek-V3's n_group): the experts fall into
  // `expert_groups` groups of consecutive ids (0: no groups), and the
  // co-activation of two experts of one group weighs (1 + group_hint) times
  // in the cut, so that a group tends to stay on one island (a hint, not a
  // constraint: a strong enough cross-group pull still splits it).
  int expert_groups = 0;
  double group_hint = 0;
};

// The island of each slot of `layer`: METIS cuts the slots' co-activation
// graph (an expert pair's count shared evenly among their replicas, weighed
// up inside a group by rules.group_hint; vertex weight the slot's load,
// targets by island size); then no island keeps more than
// rules.slots_per_rank x its ranks slots nor an expert more copies than it
// may hold (one per island as far as they go, unless pooled_experts pools it
// and its co-activation is below kConcentratedShare: repair), and island
// loads per rank come within rules.island_tolerance of the mean where moves
// allow (balance).
// Seeded: the same inputs give the same islands.
std::vector<int> partition_into_islands(const std::vector<ExpertSlot>& slots, const std::vector<int>& replicas,
                                        const routing::RoutingStats& stats, int layer, const Topology& topology,
                                        const IslandRules& rules, std::uint64_t seed);

// Balance alone, from given islands (already feasible): after the slots'
// loads were re-estimated (dispatch_slot_loads), island loads per rank come
// back within rules.island_tolerance of the mean where moves allow, losing
// the least co-activation.
std::vector<int> rebalance_islands(std::vector<int> island, const std::vector<ExpertSlot>& slots,
                                   const std::vector<int>& replicas, const routing::RoutingStats& stats, int layer,
                                   const Topology& topology, const IslandRules& rules);

}  // namespace moed::placement
