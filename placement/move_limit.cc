#include "placement/move_limit.h"

#include <algorithm>
#include <deque>
#include <vector>

#include "placement/cost_model.h"
#include "placement/placement_diff.h"

namespace moed::placement {

namespace {

// Groups the moves of one layer so that applying a group keeps every rank's
// slot count, except where the target itself changes it. A move is an edge
// drop -> to between ranks (-1: nowhere, for new replicas and releases);
// a group is a maximal chain grown from a move in both directions, each step
// taking a move that frees a slot where the chain fills one (forward) or
// fills a slot where it frees one (backward). Every rank a chain passes
// through keeps its count; a chain ends only where no move is left to pair
// with, i.e. where the target adds or removes slots, or at "nowhere".
// The cut moves of one expert (a split) are one group of their own: they apply together.
std::vector<std::vector<Move>> group_moves(const std::vector<Move>& layer_moves) {
  const std::size_t n = layer_moves.size();
  std::vector<bool> used(n, false);
  std::vector<std::vector<Move>> groups;
  for (std::size_t i = 0; i < n; ++i) {
    if (used[i] || !layer_moves[i].cut) continue;
    std::vector<Move> split;
    for (std::size_t j = i; j < n; ++j)
      if (!used[j] && layer_moves[j].cut && layer_moves[j].expert == layer_moves[i].expert)
        used[j] = true, split.push_back(layer_moves[j]);
    groups.push_back(std::move(split));
  }
  auto take = [&](auto matches) -> std::size_t {
    for (std::size_t j = 0; j < n; ++j)
      if (!used[j] && matches(layer_moves[j])) return used[j] = true, j;
    return n;
  };
  for (std::size_t seed = 0; seed < n; ++seed) {
    if (used[seed]) continue;
    used[seed] = true;
    std::deque<Move> chain{layer_moves[seed]};
    // Forward: a slot was filled on `to`; free one there. Stop at "nowhere" or a closed cycle.
    while (chain.back().to >= 0 && chain.back().to != chain.front().drop) {
      const int at = chain.back().to;
      std::size_t j = take([&](const Move& m) { return m.drop == at; });
      if (j == n) break;
      chain.push_back(layer_moves[j]);
    }
    // Backward: a slot was freed on `drop`; fill one there (unless the chain is closed).
    while (chain.front().drop >= 0 && chain.front().drop != chain.back().to) {
      const int at = chain.front().drop;
      std::size_t j = take([&](const Move& m) { return m.to == at; });
      if (j == n) break;
      chain.push_front(layer_moves[j]);
    }
    groups.emplace_back(chain.begin(), chain.end());
  }
  return groups;
}

}  // namespace

Placement limit_moves(const Placement& current, const Placement& target, int max_moves,
                      const routing::RoutingTrace& sample, const Topology& topology) {
  std::vector<Move> all = moves(current, target);
  struct Priced {
    std::vector<Move> group;
    double gain_per_move;
  };
  std::vector<Priced> priced;
  const std::size_t T = sample.tokens();
  for (int l = 0; l < current.layers(); ++l) {
    std::vector<Move> layer_moves;
    for (const Move& m : all)
      if (m.layer == l) layer_moves.push_back(m);
    if (layer_moves.empty()) continue;
    const bool has_routing = l < sample.layers() && T > 0;
    double before = has_routing ? evaluate_layer(sample, 0, T, l, current, topology).link_cost_per_token : 0;
    for (auto& group : group_moves(layer_moves)) {
      double after = before;
      if (has_routing)
        after = evaluate_layer(sample, 0, T, l, apply_moves(current, group), topology).link_cost_per_token;
      std::size_t copies = std::count_if(group.begin(), group.end(), [](const Move& m) { return m.to >= 0; });
      priced.push_back({std::move(group), (before - after) / double(std::max<std::size_t>(1, copies))});
    }
  }
  std::stable_sort(priced.begin(), priced.end(),
                   [](const Priced& a, const Priced& b) { return a.gain_per_move > b.gain_per_move; });
  std::vector<Move> chosen;
  int budget = max_moves;
  for (const Priced& p : priced) {
    int copies = int(std::count_if(p.group.begin(), p.group.end(), [](const Move& m) { return m.to >= 0; }));
    if (p.gain_per_move <= 0 || copies > budget) continue;
    budget -= copies;
    chosen.insert(chosen.end(), p.group.begin(), p.group.end());
  }
  return apply_moves(current, chosen);
}

}  // namespace moed::placement
