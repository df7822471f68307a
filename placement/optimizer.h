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

#include <array>
#include <cstdint>
#include <optional>
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
  // metis: the share of each layer's replicated experts whose replicas may
  // share an island (pooled_experts, metis_partition.h), in [0, 1]; < 0:
  // the share choose_pooled_share picks from the statistics' sample.
  double pooled_share = -1;
  // metis's objective when it picks the share: max/mean rank load at most
  // the load-only baseline's (greedy-load at the same budget) + load_cap,
  // then the fewest cross-island copies.
  double load_cap = 0.05;
  // metis, with group-limited routing (DeepSeek-V3's n_group): the experts'
  // groups (consecutive ids; 0: none) and how much more an in-group
  // co-activation weighs in the cut (IslandRules, metis_partition.h): 0
  // ignores the groups, a large hint keeps each group on one island.
  int expert_groups = 0;
  double group_hint = 0;
  // metis: how far above the mean an island's load per rank may stay
  // (IslandRules). A tighter balance splits more co-routed experts: 0.5%
  // bought at most 0.006 of rank load and cost 9-10% of the cross-island
  // copies at the OLMoE and DeepSeek-V3 shapes' default budgets; with
  // group-limited routing and one slot per expert, 10% cut 8% of them at
  // the same rank load (docs/placement.md).
  double island_tolerance = 0.02;
};

Placement optimize(const routing::RoutingStats& stats, const Topology& topology, const OptimizeOptions& options);

// The pooled shares metis tries.
inline constexpr std::array<double, 5> kPooledShares{0.0, 0.25, 0.5, 0.75, 1.0};

// choose_pooled_share cuts the sample into kPoolingFolds blocks of
// consecutive tokens, and judges on at most kMaxPoolingLayers layers. A
// block must route at least kMinPairsPerExpert tokens to each expert of a
// layer on average (block tokens x top-k / experts), else loads measured on
// it are mostly sampling noise (a count of n varies by about 1 / sqrt(n):
// 18% at 32) and nothing is judged.
inline constexpr std::size_t kPoolingFolds = 4, kMinPairsPerExpert = 32;
inline constexpr int kMaxPoolingLayers = 8;

// The layers the choice is judged on: all of them up to kMaxPoolingLayers,
// else that many spread evenly over the model (the middle of each of
// kMaxPoolingLayers equal runs). Pure.
std::vector<int> pooling_layers(int layers);

// One point of metis's trade-off between cross-island copies and load: the
// placement at one pooled share, fitted on all blocks of the sample but one
// and judged by the cost model on that one, for each block in turn (the
// costs averaged).
struct PoolingTrial {
  double share = 0;
  double cross_island_copies_per_token = 0, max_mean_rank_load = 0;
  bool within_cap = false;
};

struct PoolingChoice {
  double share = 0.5;      // the pooled share metis places with
  bool load_only = false;  // greedy-load's placement won: within the cap, fewer copies than every share within it
  double balanced_load = 0, balanced_copies = 0;  // greedy-load's, measured alike
  double load_cap = 0;
  std::size_t tokens = 0;           // sampled tokens judged; 0: too few to choose (the share is then 0.5)
  std::size_t tokens_needed = 0;    // sampled tokens it takes to choose
  int layers = 0;                   // layers judged (pooling_layers)
  std::vector<PoolingTrial> front;  // every share tried, in kPooledShares order
  std::string describe() const;     // one line
};

// Chooses metis's pooled share from the statistics' sample alone, never from
// the routing the placement will serve, by k-fold cross-validation: each
// block of the sample is judged by placements (metis at every share of
// kPooledShares, and greedy-load) fitted on the other blocks. The objective
// is options.load_cap's: mean load within the cap of greedy-load's, then the
// fewest cross-island copies (ties: the lower load). greedy-load is always
// within it, so when no share is, or when greedy-load has fewer copies than
// every share that is, greedy-load's placement wins (load_only). Too few
// sampled tokens (kMinPairsPerExpert): no choice, and the share is 0.5.
// Pure and deterministic.
PoolingChoice choose_pooled_share(const routing::RoutingStats& stats, const Topology& topology,
                                  const OptimizeOptions& options);

// optimize(), with how metis chose its pooled share (none for other
// policies, or when OptimizeOptions::pooled_share fixed it). metis's
// placement is greedy-load's when the choice says load_only.
struct Optimized {
  Placement placement;
  std::optional<PoolingChoice> pooling;
};
Optimized optimize_explained(const routing::RoutingStats& stats, const Topology& topology,
                             const OptimizeOptions& options);

}  // namespace moed::placement
