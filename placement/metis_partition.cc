#include "placement/metis_partition.h"

#include <metis.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <utility>

#include "common/error.h"

namespace moed::placement {

namespace {

// Edges kept per slot: the strongest co-activations carry the partition, the
// weak tail mostly costs METIS time (a DeepSeek layer is a dense 256-vertex graph).
constexpr std::size_t kEdgesPerSlot = 16;
// One layer's slots and the co-activation between them: an expert pair's
// count shared evenly among their replicas (read once from the statistics).
struct LayerGraph {
  LayerGraph(const std::vector<ExpertSlot>& slots, const std::vector<int>& replicas,
             const routing::RoutingStats& stats, int layer, int islands, const IslandRules& rules)
      : slots(slots), replicas(replicas), experts(stats.experts()),
        coactivation(std::size_t(experts) * experts, 0.0), pooled(pooled_experts(slots, replicas, rules.pooled_share)) {
    const int group_size = rules.expert_groups > 0 ? experts / rules.expert_groups : experts;
    for (int a = 0; a < experts; ++a)
      for (int b = a + 1; b < experts; ++b) {
        const double hint = rules.expert_groups > 0 && a / group_size == b / group_size ? 1 + rules.group_hint : 1;
        coactivation[std::size_t(a) * experts + b] = coactivation[std::size_t(b) * experts + a] =
            hint * stats.coactivation(layer, a, b);
      }
    for (int e = 0; e < experts; ++e) {
      if (!pooled[std::size_t(e)]) continue;
      const std::span<const double> row(coactivation.data() + std::size_t(e) * experts, std::size_t(experts));
      if (coactivation_concentration(row, islands) >= kConcentratedShare)
        pooled[std::size_t(e)] = 0;
    }
  }
  double edge(std::size_t a, std::size_t b) const {
    const int ea = slots[a].expert, eb = slots[b].expert;
    return coactivation[std::size_t(ea) * experts + eb] / (replicas[ea] * replicas[eb]);
  }
  std::size_t size() const { return slots.size(); }

  const std::vector<ExpertSlot>& slots;
  const std::vector<int>& replicas;
  int experts;
  std::vector<double> coactivation;  // [a * experts + b], 0 on the diagonal
  std::vector<char> pooled;          // per expert: its replicas may share an island
};

// Cuts the slots of one layer into islands with METIS: vertex weight the
// slot's load (targets by island size), edge weight co-activation (each
// slot's strongest kEdgesPerSlot edges, kept symmetric). Slot counts are
// fixed afterwards by repair_islands. Returns the island of each slot.
std::vector<int> partition_slots(const LayerGraph& g, int layer, const Topology& topology, double tolerance,
                                 std::uint64_t seed) {
  const std::vector<ExpertSlot>& slots = g.slots;
  const std::size_t n = slots.size();
  idx_t parts = topology.islands();
  if (parts == 1 || n <= std::size_t(parts)) {
    std::vector<int> island(n);
    for (std::size_t i = 0; i < n; ++i) island[i] = int(i % std::size_t(parts));
    return island;
  }
  // Keep an edge if it is among the strongest of either end (so the graph stays symmetric).
  std::vector<std::vector<std::pair<double, std::size_t>>> strongest(n);
  for (std::size_t a = 0; a < n; ++a) {
    for (std::size_t b = 0; b < n; ++b)
      if (double w = g.edge(a, b); w > 0) strongest[a].push_back({w, b});
    std::size_t keep = std::min(kEdgesPerSlot, strongest[a].size());
    std::partial_sort(strongest[a].begin(), strongest[a].begin() + keep, strongest[a].end(),
                      [](auto& x, auto& y) { return x.first > y.first || (x.first == y.first && x.second < y.second); });
    strongest[a].resize(keep);
  }
  std::vector<std::vector<char>> keep(n, std::vector<char>(n, 0));
  double max_edge = 1e-300, max_load = 1e-300;
  for (std::size_t a = 0; a < n; ++a)
    for (auto [w, b] : strongest[a]) keep[a][b] = keep[b][a] = 1, max_edge = std::max(max_edge, w);
  for (const ExpertSlot& s : slots) max_load = std::max(max_load, s.load);
  // METIS takes integer weights: scale so the largest is 10^6.
  std::vector<idx_t> xadj{0}, adjncy, adjwgt, vwgt;
  for (std::size_t a = 0; a < n; ++a) {
    for (std::size_t b = 0; b < n; ++b) {
      if (!keep[a][b]) continue;
      adjncy.push_back(idx_t(b));
      adjwgt.push_back(std::max<idx_t>(1, idx_t(std::llround(g.edge(a, b) / max_edge * 1e6))));
    }
    xadj.push_back(idx_t(adjncy.size()));
    vwgt.push_back(std::max<idx_t>(1, idx_t(std::llround(slots[a].load / max_load * 1e6))));
  }
  idx_t ncon = 1, nv = idx_t(n), cut = 0;
  std::vector<real_t> tpwgts;
  for (int i = 0; i < parts; ++i) tpwgts.push_back(real_t(topology.ranks_in(i).size()) / real_t(topology.ranks()));
  std::vector<real_t> ubvec{real_t(1 + tolerance)};
  idx_t options[METIS_NOPTIONS];
  METIS_SetDefaultOptions(options);
  options[METIS_OPTION_SEED] = idx_t(seed % 1000003);
  std::vector<idx_t> part(n, 0);
  int rc = METIS_PartGraphKway(&nv, &ncon, xadj.data(), adjncy.data(), vwgt.data(), nullptr,
                               adjncy.empty() ? nullptr : adjwgt.data(), &parts, tpwgts.data(),
                               ubvec.data(), options, &cut, part.data());
  if (rc != METIS_OK) MOED_THROW(Runtime, "layer {}: METIS_PartGraphKway failed with code {}", layer, rc);
  return std::vector<int>(part.begin(), part.end());
}

// The islands of one layer's slots while they are being repaired and
// balanced, with each slot's co-activation towards every island kept up to
// date, so that pricing a move or a swap is O(1).
class IslandState {
 public:
  IslandState(std::vector<int> island, const LayerGraph& g, const Topology& topology, int slots_per_rank)
      : island_(std::move(island)), slots_(g.slots), replicas_(g.replicas), pooled_(g.pooled), I_(topology.islands()),
        count_(I_, 0), capacity_(I_), ranks_(I_), load_(I_, 0.0),
        edge_(g.size(), std::vector<double>(g.size())),
        toward_(g.size(), std::vector<double>(I_, 0.0)),
        copies_(std::size_t(I_) * g.replicas.size(), 0) {
    for (int i = 0; i < I_; ++i) {
      ranks_[i] = int(topology.ranks_in(i).size());
      capacity_[i] = slots_per_rank * ranks_[i];
    }
    for (std::size_t a = 0; a < g.size(); ++a) {
      for (std::size_t b = 0; b < g.size(); ++b) edge_[a][b] = g.edge(a, b);
      add(a, island_[a]);
    }
  }

  const std::vector<int>& islands() const { return island_; }
  std::size_t size() const { return slots_.size(); }
  int island_count() const { return I_; }
  int island(std::size_t s) const { return island_[s]; }
  bool over_capacity(int i) const { return count_[i] > capacity_[i]; }
  bool has_room(int i) const { return count_[i] < capacity_[i]; }
  // Replicas of an expert one island may hold: no more than its ranks, nor,
  // unless the expert is pooled, than an even spread over islands (a replica
  // is there for other islands).
  int allowed(int expert, int i) const {
    return std::min(ranks_[i], pooled_[expert] ? replicas_[expert] : (replicas_[expert] + I_ - 1) / I_);
  }
  int copies(int expert, int i) const { return copies_[std::size_t(i) * replicas_.size() + expert]; }
  bool over_represented(std::size_t s) const {
    return copies(slots_[s].expert, island_[s]) > allowed(slots_[s].expert, island_[s]);
  }
  bool fits(std::size_t s, int i, std::size_t leaving = SIZE_MAX) const {
    int already = copies(slots_[s].expert, i) - (leaving != SIZE_MAX && slots_[leaving].expert == slots_[s].expert);
    return already < allowed(slots_[s].expert, i);
  }
  // Load per rank of an island: what balance is judged on.
  double island_load(int i) const { return load_[i] / ranks_[i]; }
  double mean_rank_load() const {
    double total = 0;
    int ranks = 0;
    for (int i = 0; i < I_; ++i) total += load_[i], ranks += ranks_[i];
    return total / ranks;
  }
  // The larger per-rank load of islands a and b after `delta` load leaves a for b.
  double pair_max_after(int a, int b, double delta) const {
    return std::max((load_[a] - delta) / ranks_[a], (load_[b] + delta) / ranks_[b]);
  }
  // Co-activation lost by moving s from its island to `to` (negative: gained).
  double move_loss(std::size_t s, int to) const { return toward_[s][island_[s]] - toward_[s][to]; }
  double swap_loss(std::size_t s, std::size_t u) const {
    const int a = island_[s], b = island_[u];
    return move_loss(s, b) + move_loss(u, a) + 2 * edge_[s][u];
  }
  void move(std::size_t s, int to) {
    remove(s);
    add(s, to);
  }
  void swap(std::size_t s, std::size_t u) {
    const int a = island_[s], b = island_[u];
    remove(s);
    remove(u);
    add(s, b);
    add(u, a);
  }

 private:
  void add(std::size_t s, int i) {
    island_[s] = i;
    ++count_[i];
    load_[i] += slots_[s].load;
    ++copies_[std::size_t(i) * replicas_.size() + slots_[s].expert];
    for (std::size_t t = 0; t < slots_.size(); ++t) toward_[t][i] += edge_[t][s];
  }
  void remove(std::size_t s) {
    const int i = island_[s];
    --count_[i];
    load_[i] -= slots_[s].load;
    --copies_[std::size_t(i) * replicas_.size() + slots_[s].expert];
    for (std::size_t t = 0; t < slots_.size(); ++t) toward_[t][i] -= edge_[t][s];
  }

  std::vector<int> island_;
  const std::vector<ExpertSlot>& slots_;
  const std::vector<int>& replicas_;
  const std::vector<char>& pooled_;
  int I_;
  std::vector<int> count_, capacity_, ranks_;
  std::vector<double> load_;
  std::vector<std::vector<double>> edge_, toward_;
  std::vector<int> copies_;
};

// Makes the islands feasible for packing: no island over its slot capacity,
// no expert over-represented in an island. Each fix is the cheapest move of an
// offending slot to an island with room, or, when all are full, a swap.
void repair_islands(IslandState& st, int layer) {
  const std::size_t n = st.size();
  for (int guard = 0; guard < 100000; ++guard) {
    std::vector<std::size_t> offenders;
    for (std::size_t s = 0; s < n; ++s)
      if (st.over_capacity(st.island(s)) || st.over_represented(s)) offenders.push_back(s);
    if (offenders.empty()) return;
    double best = 0;
    std::size_t best_s = n, best_u = n;
    int best_to = -1;
    for (std::size_t s : offenders)
      for (int t = 0; t < st.island_count(); ++t) {
        if (t == st.island(s) || !st.has_room(t) || !st.fits(s, t)) continue;
        double loss = st.move_loss(s, t);
        if (best_to < 0 || loss < best) best = loss, best_s = s, best_to = t;
      }
    if (best_to >= 0) {
      st.move(best_s, best_to);
      continue;
    }
    for (std::size_t s : offenders)
      for (std::size_t u = 0; u < n; ++u) {
        if (st.island(u) == st.island(s) || !st.fits(s, st.island(u), u) || !st.fits(u, st.island(s), s)) continue;
        double loss = st.swap_loss(s, u);
        if (best_u == n || loss < best) best = loss, best_s = s, best_u = u;
      }
    MOED_CHECK(best_u < n, "layer {}: no island can take a slot", layer);
    st.swap(best_s, best_u);
  }
  MOED_CHECK(false, "layer {}: island repair did not converge", layer);
}

// Evens out island loads (per rank) to within `tolerance` of the mean: moves
// and swaps out of the most loaded island that lower the pair's maximum, the
// one losing the least co-activation first. Repairs move slots regardless of
// load, and METIS balances within a few percent only.
void balance_islands(IslandState& st, const std::vector<ExpertSlot>& slots, double tolerance) {
  const std::size_t n = st.size();
  const int I = st.island_count();
  for (int round = 0; round < 10000; ++round) {
    int top = 0;
    for (int i = 1; i < I; ++i)
      if (st.island_load(i) > st.island_load(top)) top = i;
    if (st.island_load(top) <= st.mean_rank_load() * (1 + tolerance)) return;
    double best_loss = 0;
    std::size_t best_s = n, best_u = n;
    int best_to = -1;
    auto consider = [&](double loss, std::size_t s, std::size_t u, int to) {
      if (best_s == n || loss < best_loss) best_loss = loss, best_s = s, best_u = u, best_to = to;
    };
    for (std::size_t s = 0; s < n; ++s) {
      if (st.island(s) != top) continue;
      for (int t = 0; t < I; ++t)
        if (t != top && st.has_room(t) && st.fits(s, t) &&
            st.pair_max_after(top, t, slots[s].load) < st.island_load(top))
          consider(st.move_loss(s, t), s, n, t);
      for (std::size_t u = 0; u < n; ++u) {
        const int t = st.island(u);
        if (t == top || slots[u].load >= slots[s].load || !st.fits(s, t, u) || !st.fits(u, top, s)) continue;
        if (st.pair_max_after(top, t, slots[s].load - slots[u].load) < st.island_load(top))
          consider(st.swap_loss(s, u), s, u, t);
      }
    }
    if (best_s == n) return;
    if (best_u == n)
      st.move(best_s, best_to);
    else
      st.swap(best_s, best_u);
  }
}

}  // namespace

std::vector<char> pooled_experts(const std::vector<ExpertSlot>& slots, const std::vector<int>& replicas,
                                 double share) {
  std::vector<double> load(replicas.size(), 0.0);
  for (const ExpertSlot& s : slots) load[std::size_t(s.expert)] += s.load;
  std::vector<int> replicated;
  for (std::size_t e = 0; e < replicas.size(); ++e)
    if (replicas[e] > 1) replicated.push_back(int(e));
  std::stable_sort(replicated.begin(), replicated.end(), [&](int a, int b) { return load[a] > load[b]; });
  std::vector<char> pooled(replicas.size(), 0);
  const auto count = std::size_t(std::ceil(share * double(replicated.size()) - 1e-9));
  for (std::size_t k = 0; k < count && k < replicated.size(); ++k) pooled[std::size_t(replicated[k])] = 1;
  return pooled;
}

double coactivation_concentration(std::span<const double> row, int islands) {
  const int partners = islands > 0 ? int(row.size()) / islands - 1 : 0;
  if (partners <= 0) return 0;
  std::vector<double> sorted(row.begin(), row.end());
  std::sort(sorted.begin(), sorted.end(), std::greater<>());
  double total = 0, strongest = 0;
  for (std::size_t k = 0; k < sorted.size(); ++k) {
    total += sorted[k];
    if (k < std::size_t(partners)) strongest += sorted[k];
  }
  return total > 0 ? strongest / total : 0;
}

std::vector<int> partition_into_islands(const std::vector<ExpertSlot>& slots, const std::vector<int>& replicas,
                                        const routing::RoutingStats& stats, int layer, const Topology& topology,
                                        const IslandRules& rules, std::uint64_t seed) {
  const LayerGraph graph(slots, replicas, stats, layer, topology.islands(), rules);
  IslandState state(partition_slots(graph, layer, topology, rules.island_tolerance, seed), graph, topology,
                    rules.slots_per_rank);
  repair_islands(state, layer);
  balance_islands(state, slots, rules.island_tolerance);
  return state.islands();
}

std::vector<int> rebalance_islands(std::vector<int> island, const std::vector<ExpertSlot>& slots,
                                   const std::vector<int>& replicas, const routing::RoutingStats& stats, int layer,
                                   const Topology& topology, const IslandRules& rules) {
  const LayerGraph graph(slots, replicas, stats, layer, topology.islands(), rules);
  IslandState state(std::move(island), graph, topology, rules.slots_per_rank);
  balance_islands(state, slots, rules.island_tolerance);
  return state.islands();
}

}  // namespace moed::placement
