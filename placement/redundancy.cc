#include "placement/redundancy.h"

#include <algorithm>
#include <numeric>

#include "common/error.h"

namespace moed::placement {
namespace {

void check_stats(const Placement& p, const routing::RoutingStats& stats) {
  MOED_CHECK(stats.layers() == p.layers() && stats.experts() == p.experts(),
             "statistics of {} layers x {} experts for a placement of {} x {}", stats.layers(), stats.experts(),
             p.layers(), p.experts());
}

// Each rank's load in `layer`: an expert's load shared by its copies, and
// by a copy's shards.
std::vector<double> rank_loads(const Placement& p, const routing::RoutingStats& stats, int layer) {
  std::vector<double> load(std::size_t(p.ranks()), 0.0);
  for (int e = 0; e < p.experts(); ++e) {
    const auto& ranks = p.replicas(layer, e);
    if (ranks.empty()) continue;
    const double each = stats.load(layer, e) / double(ranks.size());
    for (int r : ranks) load[std::size_t(r)] += each;
  }
  return load;
}

bool holds(const std::vector<int>& ranks, int r) { return std::find(ranks.begin(), ranks.end(), r) != ranks.end(); }

// Experts of `layer` hottest first (ties: the lower id).
std::vector<int> hottest_first(const routing::RoutingStats& stats, int layer, std::vector<int> experts) {
  std::stable_sort(experts.begin(), experts.end(),
                   [&](int a, int b) { return stats.load(layer, a) > stats.load(layer, b); });
  return experts;
}

// held[i]: island i holds a copy of (layer, expert).
std::vector<bool> islands_with_copy(const Placement& p, const Topology& topology, int layer, int expert) {
  std::vector<bool> held(std::size_t(topology.islands()), false);
  for (int c = 0; c < p.copies(layer, expert); ++c) held[std::size_t(topology.island_of(p.copy(layer, expert, c)[0]))] = true;
  return held;
}

}  // namespace

routing::RoutingStats alike_loads(int layers, int experts) {
  routing::RoutingStats alike(layers, experts, 0.0);
  for (int l = 0; l < layers; ++l)
    for (std::uint32_t e = 0; e < std::uint32_t(experts); ++e) alike.add_choice(l, std::span(&e, 1));
  return alike;
}

int islands_holding(const Placement& p, const Topology& topology, int layer, int expert) {
  const std::vector<bool> held = islands_with_copy(p, topology, layer, expert);
  return int(std::count(held.begin(), held.end(), true));
}

Placement add_island_redundancy(const Placement& p, const routing::RoutingStats& stats, const Topology& topology,
                                int islands) {
  if (islands < 1) MOED_THROW(Usage, "[placement].redundancy = {}: every expert is on at least 1 island", islands);
  check_stats(p, stats);
  MOED_CHECK(topology.ranks() == p.ranks(), "a topology of {} ranks for a placement of {}", topology.ranks(), p.ranks());
  const int want = std::min(islands, topology.islands());
  Placement out = p;
  if (want <= 1) return out;
  std::vector<int> all(std::size_t(p.experts()));
  std::iota(all.begin(), all.end(), 0);
  for (int l = 0; l < p.layers(); ++l) {
    for (int e : hottest_first(stats, l, all)) {
      while (islands_holding(out, topology, l, e) < want) {
        // A placement holds an expert whole or split, never both: a split
        // expert short of islands needs a copy of shards there instead.
        if (out.sharded(l, e))
          MOED_THROW(Usage,
                     "layer {} expert {} is split into shards on {} island(s), fewer than [placement].redundancy = "
                     "{}: split it with a copy per island (shard_per_island), or lower the redundancy",
                     l, e, islands_holding(out, topology, l, e), islands);
        const std::vector<double> load = rank_loads(out, stats, l);
        const std::vector<bool> held = islands_with_copy(out, topology, l, e);
        // The least-loaded island (per rank) without a copy, then its least-loaded rank without one.
        int best_island = -1;
        double best_island_load = 0;
        for (int i = 0; i < topology.islands(); ++i) {
          if (held[std::size_t(i)]) continue;
          double sum = 0;
          const std::vector<int> members = topology.ranks_in(i);
          for (int r : members) sum += load[std::size_t(r)];
          const double per_rank = sum / double(members.size());
          if (best_island < 0 || per_rank < best_island_load) best_island = i, best_island_load = per_rank;
        }
        int best_rank = -1;
        for (int r : topology.ranks_in(best_island))
          if (!holds(out.replicas(l, e), r) && (best_rank < 0 || load[std::size_t(r)] < load[std::size_t(best_rank)]))
            best_rank = r;
        MOED_CHECK(best_rank >= 0, "layer {} expert {}: island {} has no rank without a copy", l, e, best_island);
        std::vector<int> ranks = out.replicas(l, e);
        ranks.push_back(best_rank);
        out.set_replicas(l, e, std::move(ranks));
      }
    }
  }
  return out;
}

LossPlan drop_lost_ranks(const Placement& p, const std::vector<int>& lost) {
  for (int r : lost)
    if (r < 0 || r >= p.ranks()) MOED_THROW(Input, "lost rank {}: the ranks are 0..{}", r, p.ranks() - 1);
  LossPlan plan{p, {}};
  for (int l = 0; l < p.layers(); ++l)
    for (int e = 0; e < p.experts(); ++e) {
      std::vector<int> kept;
      for (int c = 0; c < p.copies(l, e); ++c) {
        const std::span<const int> ranks = p.copy(l, e, c);
        if (std::none_of(ranks.begin(), ranks.end(), [&](int r) { return holds(lost, r); }))
          kept.insert(kept.end(), ranks.begin(), ranks.end());
      }
      if (kept.empty()) {
        plan.survivors.set_replicas(l, e, {});
        plan.orphans.emplace_back(l, e);
      } else if (p.sharded(l, e)) {
        plan.survivors.set_shards(l, e, std::move(kept), p.shards(l, e));
      } else {
        plan.survivors.set_replicas(l, e, std::move(kept));
      }
    }
  return plan;
}

Placement adopt_orphans(const LossPlan& plan, const routing::RoutingStats& stats, const std::vector<int>& lost,
                        int max_slots) {
  const Placement& p = plan.survivors;
  check_stats(p, stats);
  std::vector<int> alive;
  for (int r = 0; r < p.ranks(); ++r)
    if (!holds(lost, r)) alive.push_back(r);
  if (alive.empty()) MOED_THROW(Runtime, "every rank of {} is lost: no survivor can take the experts", p.ranks());
  Placement out = p;
  for (int l = 0; l < p.layers(); ++l) {
    std::vector<int> orphans;
    for (const auto& [layer, e] : plan.orphans)
      if (layer == l) orphans.push_back(e);
    for (int e : hottest_first(stats, l, orphans)) {
      const std::vector<double> load = rank_loads(out, stats, l);
      int best = -1;
      for (int r : alive)
        if ((max_slots <= 0 || out.slots_on(r) < max_slots) && (best < 0 || load[std::size_t(r)] < load[std::size_t(best)]))
          best = r;
      if (best < 0)
        MOED_THROW(Runtime,
                   "layer {} expert {} lost its last copy, and every one of the {} surviving ranks holds {} slots "
                   "already (the capacity): no survivor has room to load it",
                   l, e, alive.size(), max_slots);
      out.set_replicas(l, e, {best});
    }
  }
  return out;
}

}  // namespace moed::placement
