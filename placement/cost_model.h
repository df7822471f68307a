// The cost model of a placement: one definition, used by the optimiser to
// choose and by `moe-place evaluate` (and the benchmark) to judge.
//
// For each token and layer of some routing (a trace, or the statistics'
// sample of recent tokens) the token starts on a home rank (tokens are spread
// evenly over ranks: token i's home is rank i mod R) and goes to a slot of
// each of its experts, chosen near home: the home rank if it holds one, else
// a rank of the home island, else a rank in an island the token already
// visits, else the least used; to a split expert it goes to every shard of
// one of its copies, chosen as a replica is (by the copy's island, then its
// busiest rank), each shard doing 1/S of the pair's work (a copy's shards
// share an island, so that is one cross-island copy at most, then fan-out
// inside). Counted as
// hierarchical dispatch sends:
//  - cross-island copies: remote islands the token visits (one copy each, to
//    a gateway there);
//  - same-island copies: ranks other than home in the home island, plus, in
//    each remote island, ranks beyond the first (fan-out inside it);
//  - rank and island loads: (token, expert) pairs served, summed over layers
//    as sum_l max / sum_l mean (every layer waits for its slowest rank).
#pragma once

#include <cstdint>
#include <vector>

#include "placement/placement.h"
#include "placement/topology.h"
#include "routing/routing_trace.h"

namespace moed::placement {

struct Cost {
  double cross_island_copies_per_token = 0;  // per token per MoE layer
  double same_island_copies_per_token = 0;   // per token per MoE layer
  double max_mean_rank_load = 0;
  double max_mean_island_load = 0;
  // Copies priced by the topology's link costs: what the optimiser minimises.
  double link_cost_per_token = 0;
  std::uint64_t token_layers = 0;  // (token, layer) cells with routing, counted
  // [n]: the cells whose experts were served on n islands (the home island
  // counted when a slot there served one): DeepSeek-V3's node limit (at most
  // topk_group nodes per token) is about this count.
  std::vector<std::uint64_t> token_layers_by_islands;
  // The share of cells served on more than `n` islands.
  double share_over_islands(int n) const;
};

// Tokens [first, first + count) of `routing`, over the layers both the
// routing and the placement have (callers check that the placement covers
// the routing they mean to judge).
Cost evaluate(const routing::RoutingTrace& routing, std::size_t first, std::size_t count,
              const Placement& placement, const Topology& topology);
inline Cost evaluate(const routing::RoutingTrace& routing, const Placement& placement,
                     const Topology& topology) {
  return evaluate(routing, 0, routing.tokens(), placement, topology);
}

// The same, for one layer only (the optimiser's inner loop).
Cost evaluate_layer(const routing::RoutingTrace& routing, std::size_t first, std::size_t count, int layer,
                    const Placement& placement, const Topology& topology);

// Slots that moving from `from` to `to` fills (each a copy of one expert's
// weights, or one shard's: 1/S of them) and the bytes they carry; a holder
// that keeps a shard of the expert it splits fills no slot (cut in place).
struct MoveCost {
  std::uint64_t slots = 0;
  std::uint64_t bytes = 0;
};
MoveCost move_cost(const Placement& from, const Placement& to, std::uint64_t bytes_per_expert);

}  // namespace moed::placement
