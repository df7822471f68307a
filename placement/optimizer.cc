#include "placement/optimizer.h"

#include <algorithm>
#include <numeric>

#include "common/error.h"
#include "placement/assignment.h"
#include "placement/dispatch_estimate.h"
#include "placement/metis_partition.h"

namespace moed::placement {

namespace {

// Sampled tokens metis replays dispatch on: enough to see which replica
// draws the tokens from islands without one, few enough to keep DeepSeek-V3's
// shape near a second.
constexpr std::size_t kDispatchTokens = 2048;
constexpr int kDispatchRounds = 1;

std::vector<double> layer_loads(const routing::RoutingStats& stats, int layer) {
  std::vector<double> loads(stats.experts());
  for (int e = 0; e < stats.experts(); ++e) loads[e] = stats.load(layer, e);
  return loads;
}

// Renames layer `layer`'s islands so that they follow layer - 1's by
// affinity (islands of equal size only).
void align_islands(std::vector<int>& island, const std::vector<ExpertSlot>& slots,
                   const Placement& p, const routing::RoutingStats& stats, int layer, const Topology& topology) {
  const int I = topology.islands();
  for (int i = 1; i < I; ++i)
    if (topology.ranks_in(i).size() != topology.ranks_in(0).size()) return;
  std::vector<std::vector<double>> gain(I, std::vector<double>(I, 0.0));
  for (int a = 0; a < stats.experts(); ++a) {
    const auto& prev = p.replicas(layer - 1, a);
    for (std::size_t s = 0; s < slots.size(); ++s) {
      double w = stats.affinity(layer - 1, a, slots[s].expert) / double(prev.size());
      for (int r : prev) gain[topology.island_of(r)][island[s]] += w;
    }
  }
  std::vector<int> column = max_gain_assignment(gain);  // previous island -> this layer's label
  std::vector<int> rename(I);
  for (int i = 0; i < I; ++i) rename[column[i]] = i;
  for (int& i : island) i = rename[i];
}

SlotBudget slot_budget(const OptimizeOptions& o) { return {o.slots_per_rank, o.redundant_slots}; }

// One layer's slots and where they may go, the same for every balancing policy.
struct LayerSlots {
  std::vector<int> replicas;
  std::vector<ExpertSlot> slots;
  int capacity;
};

LayerSlots layer_slots_of(const routing::RoutingStats& stats, const Topology& topology, const OptimizeOptions& o,
                          int layer) {
  const int R = topology.ranks();
  std::vector<double> loads = layer_loads(stats, layer);
  const SlotBudget budget = slot_budget(o);
  const int total = o.replicate ? layer_slots(budget, loads, R, topology.islands()) : stats.experts();
  LayerSlots ls;
  ls.replicas = replica_counts(loads, R, total);
  ls.capacity = rank_capacity(budget, total, R);
  ls.slots = make_slots(loads, ls.replicas);
  return ls;
}

void clear_layer(Placement& p, int layer) {
  for (int e = 0; e < p.experts(); ++e) p.set_replicas(layer, e, {});
}

void place_greedy_layer(const LayerSlots& ls, const Topology& topology, int layer, Placement& p) {
  std::vector<int> all_ranks(topology.ranks());
  std::iota(all_ranks.begin(), all_ranks.end(), 0);
  clear_layer(p, layer);
  pack_by_load(ls.slots, all_ranks, ls.capacity, layer, p);
}

// The sampled tokens metis judges dispatch on (the most recent).
struct Sample {
  const routing::RoutingTrace& trace;
  std::size_t first, count;
};

void place_metis_layer(const LayerSlots& ls, const routing::RoutingStats& stats, const Sample& sample,
                       const Topology& topology, const OptimizeOptions& o, int layer, Placement& p) {
  const IslandRules rules{ls.capacity, o.pooled_share, o.island_tolerance, o.expert_groups, o.group_hint};
  std::vector<int> island = partition_into_islands(ls.slots, ls.replicas, stats, layer, topology, rules, o.seed + layer);
  if (o.affinity && layer > 0) align_islands(island, ls.slots, p, stats, layer, topology);
  std::vector<ExpertSlot> slots = ls.slots;
  const bool replicated = ls.slots.size() > ls.replicas.size();
  if (replicated && sample.count > 0) {
    // Replicas' shares as dispatch will send them, then islands evened out on those.
    for (int round = 0; round < kDispatchRounds; ++round) {
      slots = dispatch_slot_loads(sample.trace, sample.first, sample.count, layer, ls.slots, island, topology);
      island = rebalance_islands(std::move(island), slots, ls.replicas, stats, layer, topology, rules);
    }
    slots = dispatch_slot_loads(sample.trace, sample.first, sample.count, layer, ls.slots, island, topology);
  }
  clear_layer(p, layer);
  for (int i = 0; i < topology.islands(); ++i) {
    std::vector<ExpertSlot> mine;
    for (std::size_t s = 0; s < slots.size(); ++s)
      if (island[s] == i) mine.push_back(slots[s]);
    pack_by_load(mine, topology.ranks_in(i), ls.capacity, layer, p);
  }
}

Placement place(const routing::RoutingStats& stats, const Topology& topology, const OptimizeOptions& o) {
  const int R = topology.ranks(), L = stats.layers(), E = stats.experts();
  if (!o.replicate && o.redundant_slots > 0)
    MOED_THROW(Usage, "{} redundant slots with replication off: every expert has one slot", o.redundant_slots);
  // Refuses a budget that cannot hold every expert, or cannot be spent, whatever the policy.
  if (o.replicate || o.slots_per_rank > 0) layer_slots(slot_budget(o), std::vector<double>(E, 0.0), R, topology.islands());
  if (o.policy == OptimizerPolicy::contiguous) return contiguous(R, L, E);
  if (o.policy == OptimizerPolicy::round_robin) return round_robin(R, L, E);
  if (o.policy != OptimizerPolicy::metis && o.policy != OptimizerPolicy::greedy_load)
    MOED_THROW(Internal, "unknown optimizer policy {}", int(o.policy));
  Placement p(R, L, E);
  if (o.policy == OptimizerPolicy::greedy_load) {
    for (int l = 0; l < L; ++l) place_greedy_layer(layer_slots_of(stats, topology, o, l), topology, l, p);
  } else {
    // metis estimates replicas' shares by replaying dispatch on the
    // statistics' most recent sampled tokens.
    const routing::RoutingTrace sample = stats.sample_trace();
    const std::size_t count = std::min<std::size_t>(sample.tokens(), kDispatchTokens);
    for (int l = 0; l < L; ++l)
      place_metis_layer(layer_slots_of(stats, topology, o, l), stats, Sample{sample, sample.tokens() - count, count},
                        topology, o, l, p);
  }
  p.validate("optimiser");
  return p;
}

}  // namespace

Placement optimize(const routing::RoutingStats& stats, const Topology& topology, const OptimizeOptions& o) {
  return optimize_explained(stats, topology, o).placement;
}

Optimized optimize_explained(const routing::RoutingStats& stats, const Topology& topology,
                             const OptimizeOptions& options) {
  if (!(options.pooled_share <= 1))  // NaN too
    MOED_THROW(Usage, "pooled share {}: a share of the replicated experts, at most 1 (< 0: chosen)", options.pooled_share);
  if (!(options.load_cap >= 0)) MOED_THROW(Usage, "load cap {}: must be >= 0", options.load_cap);
  if (!(options.group_hint >= 0)) MOED_THROW(Usage, "group hint {}: must be >= 0", options.group_hint);
  if (!(options.island_tolerance >= 0 && options.island_tolerance <= 1))
    MOED_THROW(Usage, "island tolerance {}: a share of the mean load, in [0, 1]", options.island_tolerance);
  if (options.expert_groups < 0 || (options.expert_groups > 0 && stats.experts() % options.expert_groups != 0))
    MOED_THROW(Usage, "{} expert groups do not divide the {} experts", options.expert_groups, stats.experts());
  OptimizeOptions o = options;
  std::optional<PoolingChoice> pooling;
  if (o.policy == OptimizerPolicy::metis && o.pooled_share < 0) {
    pooling = choose_pooled_share(stats, topology, o);
    o.pooled_share = pooling->share;
    if (pooling->load_only) o.policy = OptimizerPolicy::greedy_load;
  }
  return {place(stats, topology, o), std::move(pooling)};
}

}  // namespace moed::placement
