// The METIS step of the metis policy: one layer's slots cut into islands so
// that experts often chosen together (co-activation) share an island, with
// island loads balanced by island size. METIS's cut is then made feasible
// for packing and evened out by moves and swaps that lose the least
// co-activation.
#pragma once

#include <cstdint>
#include <vector>

#include "placement/slot_packing.h"
#include "placement/topology.h"
#include "routing/routing_stats.h"

namespace moed::placement {

// The island of each slot of `layer`: METIS cuts the slots' co-activation
// graph (an expert pair's count shared evenly among their replicas; vertex
// weight the slot's load, targets by island size); then no island keeps more
// than slots_per_rank x its ranks slots nor an expert more copies than it may
// hold (repair), and island loads per rank come within 2% of the mean where
// moves allow (balance). Seeded: the same inputs give the same islands.
std::vector<int> partition_into_islands(const std::vector<ExpertSlot>& slots, const std::vector<int>& replicas,
                                        const routing::RoutingStats& stats, int layer, const Topology& topology,
                                        int slots_per_rank, std::uint64_t seed);

// Balance alone, from given islands (already feasible): after the slots'
// loads were re-estimated (dispatch_slot_loads), island loads per rank come
// back within 2% of the mean where moves allow, losing the least co-activation.
std::vector<int> rebalance_islands(std::vector<int> island, const std::vector<ExpertSlot>& slots,
                                   const std::vector<int>& replicas, const routing::RoutingStats& stats, int layer,
                                   const Topology& topology, int slots_per_rank);

}  // namespace moed::placement
