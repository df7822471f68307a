#include "placement/slot_packing.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "common/error.h"

namespace moed::placement {

std::vector<int> replica_counts(const std::vector<double>& loads, int ranks, int slots_per_rank,
                                int redundant) {
  const int E = int(loads.size());
  const double total = std::accumulate(loads.begin(), loads.end(), 0.0);
  std::vector<int> r(E, 1);
  if (total <= 0) return r;
  const double fair = total / ranks;
  for (int e = 0; e < E; ++e)
    if (loads[e] > fair) r[e] = std::min(ranks, int(std::ceil(loads[e] / fair - 1e-9)));
  // Redundant slots, one at a time to the expert with the most load per slot.
  for (int n = 0; n < redundant; ++n) {
    int pick = -1;
    for (int e = 0; e < E; ++e)
      if (r[e] < ranks && loads[e] > 0 && (pick < 0 || loads[e] / r[e] > loads[pick] / r[pick])) pick = e;
    if (pick < 0) break;
    ++r[pick];
  }
  if (slots_per_rank > 0) {
    // Trim the replica that least reduces the per-slot load, until they fit.
    while (std::accumulate(r.begin(), r.end(), 0) > ranks * slots_per_rank) {
      int pick = -1;
      for (int e = 0; e < E; ++e)
        if (r[e] > 1 && (pick < 0 || loads[e] / (r[e] - 1) < loads[pick] / (r[pick] - 1))) pick = e;
      if (pick < 0) break;
      --r[pick];
    }
  }
  return r;
}

std::vector<ExpertSlot> make_slots(const std::vector<double>& loads, const std::vector<int>& replicas) {
  std::vector<ExpertSlot> slots;
  for (int e = 0; e < int(loads.size()); ++e)
    for (int i = 0; i < replicas[e]; ++i) slots.push_back({e, loads[e] / replicas[e]});
  return slots;
}

int slots_per_rank_for(const std::vector<int>& replicas, int ranks, int requested, int experts) {
  int needed = (std::accumulate(replicas.begin(), replicas.end(), 0) + ranks - 1) / ranks;
  int minimum = (experts + ranks - 1) / ranks;
  if (requested == 0) return std::max(needed, minimum);
  if (requested < minimum)
    MOED_THROW(Usage, "{} slots per rank cannot hold {} experts on {} ranks (need at least {})",
               requested, experts, ranks, minimum);
  return requested;
}

void pack_by_load(const std::vector<ExpertSlot>& slots, const std::vector<int>& ranks, int capacity,
                  int layer, Placement& p) {
  const std::size_t R = ranks.size();
  std::vector<int> order(slots.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](int a, int b) { return slots[a].load > slots[b].load; });
  std::vector<double> load(R, 0.0);
  std::vector<std::vector<int>> held(R);  // slot indices per rank
  auto holds_expert = [&](std::size_t r, int expert, int except = -1) {
    for (int s : held[r])
      if (s != except && slots[s].expert == expert) return true;
    return false;
  };
  for (int i : order) {
    int best = -1;
    for (std::size_t j = 0; j < R; ++j) {
      if (int(held[j].size()) >= capacity || holds_expert(j, slots[i].expert)) continue;
      if (best < 0 || load[j] < load[best]) best = int(j);
    }
    MOED_CHECK(best >= 0, "layer {}: no rank has room for expert {}", layer, slots[i].expert);
    load[best] += slots[i].load;
    held[best].push_back(i);
  }
  for (int round = 0; round < 1000; ++round) {
    std::size_t top = std::size_t(std::max_element(load.begin(), load.end()) - load.begin());
    double best_max = load[top] * (1 - 1e-9);
    std::size_t best_r = R;
    int best_a = -1, best_b = -1;  // best_b < 0: move a into free room
    for (std::size_t r = 0; r < R; ++r) {
      if (r == top) continue;
      for (int a : held[top]) {
        if (int(held[r].size()) < capacity && !holds_expert(r, slots[a].expert)) {
          double m = std::max(load[top] - slots[a].load, load[r] + slots[a].load);
          if (m < best_max) best_max = m, best_r = r, best_a = a, best_b = -1;
        }
        for (int b : held[r]) {
          double d = slots[a].load - slots[b].load;
          if (d <= 0 || holds_expert(r, slots[a].expert, b) || holds_expert(top, slots[b].expert, a)) continue;
          double m = std::max(load[top] - d, load[r] + d);
          if (m < best_max) best_max = m, best_r = r, best_a = a, best_b = b;
        }
      }
    }
    if (best_r == R) break;
    auto& from = held[top];
    from.erase(std::find(from.begin(), from.end(), best_a));
    held[best_r].push_back(best_a);
    load[top] -= slots[best_a].load;
    load[best_r] += slots[best_a].load;
    if (best_b >= 0) {
      auto& other = held[best_r];
      other.erase(std::find(other.begin(), other.end(), best_b));
      from.push_back(best_b);
      load[top] += slots[best_b].load;
      load[best_r] -= slots[best_b].load;
    }
  }
  for (std::size_t r = 0; r < R; ++r) {
    std::sort(held[r].begin(), held[r].end());
    for (int i : held[r]) {
      std::vector<int> holders = p.replicas(layer, slots[i].expert);
      holders.push_back(ranks[r]);
      p.set_replicas(layer, slots[i].expert, std::move(holders));
    }
  }
}

}  // namespace moed::placement
