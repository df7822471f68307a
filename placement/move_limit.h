// Limiting a reoptimisation to a budget of moves: of the moves from the
// current placement to a new one (placement/placement_diff.h), the groups
// worth most per slot moved, applied so that the result stays valid.
#pragma once

#include "placement/placement.h"
#include "placement/topology.h"
#include "routing/routing_trace.h"

namespace moed::placement {

// At most `max_moves` of the moves from `current` to `target`: the moves are
// grouped so that every rank keeps its slot count (cycles of moves), each
// group is priced by the cost model on `sample` (copies at the topology's
// link costs), and the groups with the best gain per slot moved are applied,
// best first, while they fit.
Placement limit_moves(const Placement& current, const Placement& target, int max_moves,
                      const routing::RoutingTrace& sample, const Topology& topology);

}  // namespace moed::placement
