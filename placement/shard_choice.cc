#include "placement/shard_choice.h"

#include <algorithm>
#include <numeric>

#include "common/error.h"

namespace moed::placement {

namespace {

// Expert memory of each rank in one layer, in whole experts (a shard: 1/S).
std::vector<double> memory_in_layer(const Placement& p, int layer) {
  std::vector<double> held(std::size_t(p.ranks()), 0.0);
  for (int e = 0; e < p.experts(); ++e)
    for (int r : p.replicas(layer, e)) held[std::size_t(r)] += 1.0 / p.shards(layer, e);
  return held;
}

// The island most of `ranks` sit on (the first one's on a tie).
int main_island(const std::vector<int>& ranks, const Topology& topology) {
  std::vector<int> count(std::size_t(topology.islands()), 0);
  for (int r : ranks) ++count[std::size_t(topology.island_of(r))];
  int best = topology.island_of(ranks.front());
  for (int i = 0; i < topology.islands(); ++i)
    if (count[std::size_t(i)] > count[std::size_t(best)]) best = i;
  return best;
}

}  // namespace

Placement split_hot_experts(const Placement& p, const routing::RoutingStats& stats, const Topology& topology,
                            const ShardRule& rule) {
  if (rule.over_mean <= 0) return p;
  if (rule.shards < 2) MOED_THROW(Usage, "a split expert has at least 2 shards, not {}", rule.shards);
  MOED_CHECK(stats.layers() == p.layers() && stats.experts() == p.experts() && topology.ranks() == p.ranks(),
             "statistics of {}x{} and a topology of {} ranks for a placement of {}x{} on {}", stats.layers(),
             stats.experts(), topology.ranks(), p.layers(), p.experts(), p.ranks());
  Placement out = p;
  const int S = rule.shards;
  for (int l = 0; l < p.layers(); ++l) {
    double total = 0;
    for (int e = 0; e < p.experts(); ++e) total += stats.load(l, e);
    const double mean = total / p.experts();
    std::vector<int> hot;
    for (int e = 0; e < p.experts(); ++e)
      if (mean > 0 && stats.load(l, e) > rule.over_mean * mean && !out.sharded(l, e)) hot.push_back(e);
    std::stable_sort(hot.begin(), hot.end(), [&](int a, int b) { return stats.load(l, a) > stats.load(l, b); });
    for (int e : hot) {
      const std::vector<int> holders = out.replicas(l, e);
      std::vector<double> held = memory_in_layer(out, l);
      for (int r : holders) held[std::size_t(r)] -= 1.0;  // the expert's own copies go
      // S ranks of `island` for one copy: its holders there first, then the
      // island's ranks with the least expert memory; empty if it is too small.
      auto copy_on_island = [&](int island) {
        std::vector<int> ranks;
        for (int r : holders)
          if (topology.island_of(r) == island) ranks.push_back(r);
        ranks.resize(std::min(ranks.size(), std::size_t(S)));
        std::vector<int> others;
        for (int r : topology.ranks_in(island))
          if (std::find(ranks.begin(), ranks.end(), r) == ranks.end()) others.push_back(r);
        std::stable_sort(others.begin(), others.end(),
                         [&](int a, int b) { return held[std::size_t(a)] < held[std::size_t(b)]; });
        for (int r : others)
          if (int(ranks.size()) < S) ranks.push_back(r);
        if (int(ranks.size()) < S) ranks.clear();
        return ranks;
      };
      std::vector<int> islands{main_island(holders, topology)};
      if (rule.per_island)
        for (int r : holders)
          if (std::find(islands.begin(), islands.end(), topology.island_of(r)) == islands.end())
            islands.push_back(topology.island_of(r));
      std::vector<int> ranks;
      for (int island : islands) {
        const std::vector<int> one = copy_on_island(island);
        ranks.insert(ranks.end(), one.begin(), one.end());
      }
      if (ranks.empty()) continue;  // no island holding it is large enough
      const bool fits = std::all_of(ranks.begin(), ranks.end(), [&](int r) {
        return rule.slots_per_rank <= 0 || held[std::size_t(r)] + 1.0 / S <= rule.slots_per_rank + 1e-9;
      });
      if (!fits) continue;
      out.set_shards(l, e, std::move(ranks), S);
    }
  }
  return out;
}

Placement keep_splits(const Placement& current, Placement next) {
  MOED_CHECK(current.layers() == next.layers() && current.experts() == next.experts() &&
                 current.ranks() == next.ranks(),
             "placements of {}x{} on {} and {}x{} on {}", current.layers(), current.experts(), current.ranks(),
             next.layers(), next.experts(), next.ranks());
  for (int l = 0; l < current.layers(); ++l)
    for (int e = 0; e < current.experts(); ++e)
      if (current.sharded(l, e)) next.set_shards(l, e, current.replicas(l, e), current.shards(l, e));
  return next;
}

}  // namespace moed::placement
