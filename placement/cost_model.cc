#include "placement/cost_model.h"

#include <algorithm>
#include <numeric>

#include "common/error.h"

namespace moed::placement {

namespace {

// Per-layer accumulation of the model's counts.
struct Tally {
  double cross = 0, same = 0;
  std::uint64_t cells = 0;
  std::vector<std::uint64_t> by_islands;
  double max_rank = 0, mean_rank = 0, max_island = 0, mean_island = 0;  // summed over layers
};

// Picks the serving rank of each expert of one token (see the header) and
// counts its copies; adds the pairs served to `rank_load`.
class TokenRouter {
 public:
  TokenRouter(const Topology& t) : topology_(t), island_used_(t.islands(), 0), rank_used_(t.ranks(), 0) {}

  void route(std::span<const routing::RoutingChoice> choices, int layer, int home, const Placement& p,
             std::vector<double>& rank_load, Tally& tally) {
    const int home_island = topology_.island_of(home);
    ++epoch_;
    int remote_islands = 0, remote_ranks = 0, home_island_ranks = 0;
    bool home_island_used = false;
    auto visit = [&](int r, double work) {
      rank_load[r] += work;
      if (rank_used_[r] == epoch_) return;
      rank_used_[r] = epoch_;
      int island = topology_.island_of(r);
      if (island == home_island) {
        home_island_used = true;
        home_island_ranks += r != home;
      } else {
        ++remote_ranks;
        if (island_used_[island] != epoch_) island_used_[island] = epoch_, ++remote_islands;
      }
    };
    for (const routing::RoutingChoice& c : choices) {
      // The row goes to every rank of one copy: a replica, or a copy's S
      // shards, each doing 1/S of the pair's work.
      const int e = int(c.expert), S = p.shards(layer, e);
      for (int r : p.copy(layer, e, pick(p, layer, e, home, home_island, rank_load))) visit(r, 1.0 / double(S));
    }
    tally.cross += remote_islands;
    tally.same += home_island_ranks + (remote_ranks - remote_islands);
    ++tally.cells;
    const std::size_t islands = std::size_t(remote_islands + (home_island_used ? 1 : 0));
    if (tally.by_islands.size() <= islands) tally.by_islands.resize(islands + 1, 0);
    ++tally.by_islands[islands];
  }

 private:
  // The copy of (layer, e) that serves the row: by class of its island, then its least loaded rank.
  int pick(const Placement& p, int layer, int e, int home, int home_island, const std::vector<double>& rank_load) {
    const int copies = p.copies(layer, e);
    if (copies == 1) return 0;
    int best = -1, best_class = 4;
    double best_load = 0;
    for (int c = 0; c < copies; ++c) {
      const std::span<const int> ranks = p.copy(layer, e, c);
      // 0: home rank, 1: home island, 2: an island this token already visits, 3: elsewhere.
      const int island = topology_.island_of(ranks[0]);
      const bool at_home = std::find(ranks.begin(), ranks.end(), home) != ranks.end();
      const int cls = at_home ? 0 : island == home_island ? 1 : island_used_[island] == epoch_ ? 2 : 3;
      double load = 0;
      for (int r : ranks) load = std::max(load, rank_load[r]);
      if (cls < best_class || (cls == best_class && load < best_load)) best = c, best_class = cls, best_load = load;
    }
    return best;
  }

  const Topology& topology_;
  std::vector<std::uint64_t> island_used_, rank_used_;  // epoch stamps
  std::uint64_t epoch_ = 0;
};

void add_layer_loads(const std::vector<double>& rank_load, const Topology& t, Tally& tally) {
  std::vector<double> island_load(t.islands(), 0.0);
  double total = 0;
  for (int r = 0; r < t.ranks(); ++r) island_load[t.island_of(r)] += rank_load[r], total += rank_load[r];
  if (total == 0) return;
  tally.max_rank += *std::max_element(rank_load.begin(), rank_load.end());
  tally.mean_rank += total / t.ranks();
  // Islands compare per rank: an island of 4 ranks should carry twice one of 2.
  double max_island = 0;
  for (int i = 0; i < t.islands(); ++i)
    max_island = std::max(max_island, island_load[i] / double(t.ranks_in(i).size()));
  tally.max_island += max_island;
  tally.mean_island += total / t.ranks();
}

void tally_layer(const routing::RoutingTrace& routing, std::size_t first, std::size_t count, int layer,
                 const Placement& p, const Topology& t, TokenRouter& router, Tally& tally) {
  std::vector<double> rank_load(t.ranks(), 0.0);
  for (std::size_t i = first; i < first + count; ++i) {
    auto choices = routing.at(i, layer);
    if (choices.empty()) continue;
    router.route(choices, layer, int(i % std::size_t(t.ranks())), p, rank_load, tally);
  }
  add_layer_loads(rank_load, t, tally);
}

Cost finish(const Tally& t, const Topology& topology) {
  Cost c;
  c.token_layers = t.cells;
  c.token_layers_by_islands = t.by_islands;
  if (t.cells) {
    c.cross_island_copies_per_token = t.cross / double(t.cells);
    c.same_island_copies_per_token = t.same / double(t.cells);
    c.link_cost_per_token =
        c.cross_island_copies_per_token * topology.link_cost(LinkClass::CrossIsland) +
        c.same_island_copies_per_token * topology.link_cost(LinkClass::SameIsland);
  }
  c.max_mean_rank_load = t.mean_rank > 0 ? t.max_rank / t.mean_rank : 0;
  c.max_mean_island_load = t.mean_island > 0 ? t.max_island / t.mean_island : 0;
  return c;
}

void check_shapes(const routing::RoutingTrace& routing, std::size_t first, std::size_t count,
                  const Placement& p, const Topology& t, int layers) {
  MOED_CHECK(first + count <= routing.tokens(), "tokens [{}, {}) of a trace of {}", first,
             first + count, routing.tokens());
  MOED_CHECK(p.ranks() == t.ranks(), "placement for {} ranks, topology of {}", p.ranks(), t.ranks());
  MOED_CHECK(p.layers() >= layers && p.experts() >= routing.experts(),
             "placement of {} layers x {} experts for routing of {} x {}", p.layers(), p.experts(),
             layers, routing.experts());
}

}  // namespace

Cost evaluate(const routing::RoutingTrace& routing, std::size_t first, std::size_t count,
              const Placement& placement, const Topology& topology) {
  const int layers = std::min(routing.layers(), placement.layers());
  check_shapes(routing, first, count, placement, topology, layers);
  TokenRouter router(topology);
  Tally tally;
  for (int l = 0; l < layers; ++l) tally_layer(routing, first, count, l, placement, topology, router, tally);
  return finish(tally, topology);
}

Cost evaluate_layer(const routing::RoutingTrace& routing, std::size_t first, std::size_t count, int layer,
                    const Placement& placement, const Topology& topology) {
  check_shapes(routing, first, count, placement, topology, layer + 1);
  TokenRouter router(topology);
  Tally tally;
  tally_layer(routing, first, count, layer, placement, topology, router, tally);
  return finish(tally, topology);
}

double Cost::share_over_islands(int n) const {
  const std::size_t first = std::min(std::size_t(std::max(n + 1, 0)), token_layers_by_islands.size());
  const std::uint64_t over =
      std::accumulate(token_layers_by_islands.begin() + std::ptrdiff_t(first), token_layers_by_islands.end(),
                      std::uint64_t(0));
  return token_layers ? double(over) / double(token_layers) : 0;
}

MoveCost move_cost(const Placement& from, const Placement& to, std::uint64_t bytes_per_expert) {
  MOED_CHECK(from.layers() == to.layers() && from.experts() == to.experts(),
             "move cost between placements of different shapes");
  MoveCost m;
  for (int l = 0; l < to.layers(); ++l)
    for (int e = 0; e < to.experts(); ++e) {
      const auto& old = from.replicas(l, e);
      for (int r : to.replicas(l, e))
        if (std::find(old.begin(), old.end(), r) == old.end())
          ++m.slots, m.bytes += bytes_per_expert / std::uint64_t(to.shards(l, e));  // a shard carries 1/S
    }
  return m;
}

}  // namespace moed::placement
