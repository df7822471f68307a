// Experts kept on several islands, and what a lost rank leaves (elastic
// serving, docs/elastic.md). A copy of an expert is a whole replica, or one
// copy of a split expert's shards (placement.h).
//  - add_island_redundancy: every expert on at least N islands
//    ([placement].redundancy), so that a lost rank, or a lost host, leaves
//    each expert a copy elsewhere and needs no load from the checkpoint.
//  - drop_lost_ranks: the placement without the lost ranks' slots, and the
//    experts left with no copy (orphans);
//  - adopt_orphans: each orphan on the surviving rank with the least load in
//    its layer, to be loaded from the checkpoint.
// Pure and deterministic: unit-tested apart from the daemon.
#pragma once

#include <utility>
#include <vector>

#include "placement/placement.h"
#include "placement/topology.h"
#include "routing/routing_stats.h"

namespace moed::placement {

// Statistics in which every expert of every layer carries the same load:
// what ranks plan with when each must come to the same placement on its own
// (their routing statistics differ).
routing::RoutingStats alike_loads(int layers, int experts);

// Distinct islands holding a copy of (layer, expert).
int islands_holding(const Placement& p, const Topology& topology, int layer, int expert);

// `p` with every expert of every layer on at least min(islands, topology's
// islands) islands: for each expert short of it, hottest first, a whole
// replica on each missing island in turn (the island with the least load in
// the layer first), on that island's rank with the least load that holds
// none of it. Loads are the statistics', an expert's shared evenly by its
// copies. Each added replica is a slot more: memory, the price of needing no
// load after a loss. A Usage error when `islands` < 1.
Placement add_island_redundancy(const Placement& p, const routing::RoutingStats& stats, const Topology& topology,
                                int islands);

struct LossPlan {
  Placement survivors;                      // no slot on a lost rank; orphans have none at all
  std::vector<std::pair<int, int>> orphans;  // (layer, expert) with no copy left, in order
};

// The slots of `lost` ranks removed: a whole expert keeps its other
// replicas, a split expert its copies that lost no shard (a copy that lost
// one is dropped whole: its other shards cannot serve alone). An Input error
// for a rank out of range.
LossPlan drop_lost_ranks(const Placement& p, const std::vector<int>& lost);

// `plan.survivors` with each orphan, heaviest first, whole on the surviving
// rank with the least load in its layer (ties: the lower rank) among those
// holding fewer than `max_slots` slots over all layers (0: no limit, else
// the ranks' expert memory, as validate() counts it): a valid placement on
// the ranks that are left. A Runtime error when every rank is lost, or when
// no survivor has room for an orphan (naming it).
Placement adopt_orphans(const LossPlan& plan, const routing::RoutingStats& stats, const std::vector<int>& lost,
                        int max_slots = 0);

}  // namespace moed::placement
