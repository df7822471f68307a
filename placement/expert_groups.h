// Expert groups (DeepSeek-V3's n_group: G groups of E/G consecutive expert
// ids, a token's experts in at most topk_group of them) placed with the
// islands, so that group-limited routing reaches at most topk_group islands.
// Pure.
#pragma once

#include "placement/placement.h"
#include "placement/topology.h"
#include "routing/routing_stats.h"

namespace moed::placement {

// One slot per expert, each group whole on one island: group g on island
// g * I / G, and an island's experts packed by load over its ranks
// (pack_by_load). Usage error unless G divides the experts, I divides G, and
// an island's ranks can hold its experts at ceil(E / R) per rank.
Placement align_groups_to_islands(const routing::RoutingStats& stats, const Topology& topology, int groups);

}  // namespace moed::placement
