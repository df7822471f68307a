// What each replica of an expert will serve. Replicas do not take even
// shares: dispatch (the cost model's, as hierarchical dispatch sends) sends a
// token to a replica in its home island, else in an island the token already
// visits, else the least used. METIS keeps co-routed experts together, so the
// replica beside an expert's partners draws most of the tokens from islands
// without one; packing by even shares then overloads its rank. This replays
// dispatch at island level on sampled routing to estimate each slot's load.
#pragma once

#include <cstddef>
#include <vector>

#include "placement/slot_packing.h"
#include "placement/topology.h"
#include "routing/routing_trace.h"

namespace moed::placement {

// `slots` of one layer with their loads re-estimated, given each slot's
// island: an expert's load (as in `slots`) split among its slots in the
// proportion that tokens [first, first + count) of `sample` reach them, each
// token sent once from every island as its home, weighted by the island's
// share of the ranks. Among several candidate slots the least used so far is
// taken. An expert the sample never routes keeps even
// shares. Pure and deterministic.
std::vector<ExpertSlot> dispatch_slot_loads(const routing::RoutingTrace& sample, std::size_t first,
                                            std::size_t count, int layer, const std::vector<ExpertSlot>& slots,
                                            const std::vector<int>& island, const Topology& topology);

}  // namespace moed::placement
