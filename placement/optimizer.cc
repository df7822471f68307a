#include "placement/optimizer.h"

#include <numeric>

#include "common/error.h"
#include "placement/assignment.h"
#include "placement/metis_partition.h"

namespace moed::placement {

namespace {

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

void place_layer(const routing::RoutingStats& stats, const Topology& topology, const OptimizeOptions& o,
                 int layer, Placement& p) {
  const int R = topology.ranks();
  std::vector<double> loads = layer_loads(stats, layer);
  std::vector<int> replicas =
      o.replicate ? replica_counts(loads, R, o.slots_per_rank,
                                   o.redundant_slots < 0 ? topology.islands() : o.redundant_slots)
                  : std::vector<int>(loads.size(), 1);
  int capacity = slots_per_rank_for(replicas, R, o.slots_per_rank, stats.experts());
  std::vector<ExpertSlot> slots = make_slots(loads, replicas);
  std::vector<int> all_ranks(R);
  std::iota(all_ranks.begin(), all_ranks.end(), 0);
  if (o.policy == "greedy-load") return pack_by_load(slots, all_ranks, capacity, layer, p);

  std::vector<int> island =
      partition_into_islands(slots, replicas, stats, layer, topology, capacity, o.seed + layer);
  if (o.affinity && layer > 0) align_islands(island, slots, p, stats, layer, topology);
  for (int i = 0; i < topology.islands(); ++i) {
    std::vector<ExpertSlot> mine;
    for (std::size_t s = 0; s < slots.size(); ++s)
      if (island[s] == i) mine.push_back(slots[s]);
    pack_by_load(mine, topology.ranks_in(i), capacity, layer, p);
  }
}

}  // namespace

const std::vector<std::string>& optimizer_policy_names() {
  static const std::vector<std::string> names{"metis", "greedy-load", "contiguous", "round-robin"};
  return names;
}

Placement optimize(const routing::RoutingStats& stats, const Topology& topology, const OptimizeOptions& o) {
  const int R = topology.ranks(), L = stats.layers(), E = stats.experts();
  if (o.slots_per_rank > 0) slots_per_rank_for(std::vector<int>(E, 1), R, o.slots_per_rank, E);  // refuses too few
  if (o.policy == "contiguous") return contiguous(R, L, E);
  if (o.policy == "round-robin") return round_robin(R, L, E);
  if (o.policy != "metis" && o.policy != "greedy-load")
    MOED_THROW(Usage, "unknown policy '{}': use metis, greedy-load, contiguous or round-robin", o.policy);
  Placement p(R, L, E);
  for (int l = 0; l < L; ++l) place_layer(stats, topology, o, l, p);
  p.validate("optimiser");
  return p;
}

}  // namespace moed::placement
