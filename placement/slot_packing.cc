#include "placement/slot_packing.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "common/error.h"

namespace moed::placement {

int layer_slots(const SlotBudget& budget, const std::vector<double>& loads, int ranks, int islands) {
  const int E = int(loads.size());
  const int most = E * ranks;  // every expert on every rank
  if (budget.slots_per_rank > 0 && budget.redundant_slots >= 0)
    MOED_THROW(Usage, "give slots per rank ({}) or redundant slots ({}), not both", budget.slots_per_rank,
               budget.redundant_slots);
  if (budget.slots_per_rank > 0) {
    const int minimum = (E + ranks - 1) / ranks;
    if (budget.slots_per_rank < minimum)
      MOED_THROW(Usage, "{} slots per rank cannot hold {} experts on {} ranks (need at least {})",
                 budget.slots_per_rank, E, ranks, minimum);
    if (budget.slots_per_rank > E)
      MOED_THROW(Usage,
                 "{} slots per rank cannot all be spent: a rank holds at most one slot of each of the {} experts",
                 budget.slots_per_rank, E);
    return budget.slots_per_rank * ranks;
  }
  if (budget.redundant_slots >= 0) {
    if (E + budget.redundant_slots > most)
      MOED_THROW(Usage,
                 "{} redundant slots cannot all be spent: {} experts on {} ranks have room for at most {} "
                 "(one slot of each expert per rank)",
                 budget.redundant_slots, E, ranks, most - E);
    return E + budget.redundant_slots;
  }
  const double total = std::accumulate(loads.begin(), loads.end(), 0.0);
  int needed = 0;
  for (double load : loads)
    needed += total > 0 && load > total / ranks ? std::min(ranks, int(std::ceil(load / (total / ranks) - 1e-9))) : 1;
  return std::min(most, needed + islands);
}

int rank_capacity(const SlotBudget& budget, int total, int ranks) {
  return budget.slots_per_rank > 0 ? budget.slots_per_rank : (total + ranks - 1) / ranks;
}

std::vector<int> replica_counts(const std::vector<double>& loads, int ranks, int total) {
  const int E = int(loads.size());
  MOED_CHECK(total >= E && total <= E * ranks, "{} slots for {} experts on {} ranks", total, E, ranks);
  std::vector<int> r(E, 1);
  for (int n = E; n < total; ++n) {
    int pick = -1;
    for (int e = 0; e < E; ++e)
      if (r[e] < ranks && (pick < 0 || loads[e] / r[e] > loads[pick] / r[pick])) pick = e;
    ++r[pick];
  }
  return r;
}

std::vector<ExpertSlot> make_slots(const std::vector<double>& loads, const std::vector<int>& replicas) {
  std::vector<ExpertSlot> slots;
  for (int e = 0; e < int(loads.size()); ++e)
    for (int i = 0; i < replicas[e]; ++i) slots.push_back({e, loads[e] / replicas[e]});
  return slots;
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
    if (best < 0) {
      // Every rank with room holds this expert already: make room on one that
      // does not, by moving one of its slots to a rank with room.
      for (std::size_t j = 0; j < R && best < 0; ++j) {
        if (holds_expert(j, slots[i].expert)) continue;
        for (std::size_t k = 0; k < R && best < 0; ++k) {
          if (int(held[k].size()) >= capacity) continue;
          for (int y : held[j]) {
            if (holds_expert(k, slots[y].expert)) continue;
            held[j].erase(std::find(held[j].begin(), held[j].end(), y));
            held[k].push_back(y);
            load[j] -= slots[y].load;
            load[k] += slots[y].load;
            best = int(j);
            break;
          }
        }
      }
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
