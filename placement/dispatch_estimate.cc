#include "placement/dispatch_estimate.h"

#include <algorithm>
#include <cstdint>

#include "common/error.h"

namespace moed::placement {

std::vector<ExpertSlot> dispatch_slot_loads(const routing::RoutingTrace& sample, std::size_t first,
                                            std::size_t count, int layer, const std::vector<ExpertSlot>& slots,
                                            const std::vector<int>& island, const Topology& topology) {
  MOED_CHECK(island.size() == slots.size(), "{} islands for {} slots", island.size(), slots.size());
  int experts = 0;
  for (const ExpertSlot& s : slots) experts = std::max(experts, s.expert + 1);
  std::vector<std::vector<std::size_t>> of_expert(static_cast<std::size_t>(experts));
  for (std::size_t s = 0; s < slots.size(); ++s) of_expert[std::size_t(slots[s].expert)].push_back(s);

  std::vector<double> used(slots.size(), 0.0);
  std::vector<std::uint64_t> visited(static_cast<std::size_t>(topology.islands()), 0);  // epoch stamps
  std::uint64_t epoch = 0;
  // Every home island in turn, weighted by its ranks: which island a sampled
  // token was homed in is chance, and must not be fitted.
  std::vector<double> home_weight(static_cast<std::size_t>(topology.islands()));
  for (int home = 0; home < topology.islands(); ++home)
    home_weight[std::size_t(home)] = double(topology.ranks_in(home).size()) / double(topology.ranks());
  for (std::size_t t = first; t < first + count; ++t) {
    auto choices = sample.at(t, layer);
    if (choices.empty()) continue;
    for (int home = 0; home < topology.islands(); ++home) {
      const double weight = home_weight[std::size_t(home)];
      visited[std::size_t(home)] = ++epoch;
      for (const routing::RoutingChoice& c : choices) {
        if (int(c.expert) >= experts) continue;
        const auto& mine = of_expert[c.expert];
        if (mine.empty()) continue;
        // 0: home island, 1: an island the token already visits, 2: elsewhere.
        std::size_t best = mine[0];
        int best_class = 3;
        for (std::size_t s : mine) {
          const int i = island[s];
          const int cls = i == home ? 0 : visited[std::size_t(i)] == epoch ? 1 : 2;
          if (cls < best_class || (cls == best_class && used[s] < used[best])) best = s, best_class = cls;
        }
        used[best] += weight;
        visited[std::size_t(island[best])] = epoch;
      }
    }
  }
  std::vector<ExpertSlot> out = slots;
  for (const auto& mine : of_expert) {
    if (mine.size() < 2) continue;
    double reached = 0, load = 0;
    for (std::size_t s : mine) reached += used[s], load += slots[s].load;
    if (reached <= 0) continue;
    for (std::size_t s : mine) out[s].load = load * used[s] / reached;
  }
  return out;
}

}  // namespace moed::placement
