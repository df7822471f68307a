#include "placement/optimizer.h"

#include <metis.h>

#include <algorithm>
#include <cmath>
#include <deque>
#include <numeric>

#include "common/error.h"
#include "placement/assignment.h"
#include "placement/cost_model.h"
#include "placement/placement_diff.h"

namespace moed::placement {

namespace {

// One copy of an expert in one layer, with its share of the expert's load.
struct Slot {
  int expert;
  double load;
};

std::vector<double> layer_loads(const routing::RoutingStats& stats, int layer) {
  std::vector<double> loads(stats.experts());
  for (int e = 0; e < stats.experts(); ++e) loads[e] = stats.load(layer, e);
  return loads;
}

std::vector<Slot> make_slots(const std::vector<double>& loads, const std::vector<int>& replicas) {
  std::vector<Slot> slots;
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

// Slots onto `ranks` by load: heaviest first into the lightest rank that has
// room and does not hold that expert yet (ties: the lower rank), then pairwise
// swaps (or moves into free room) between the most loaded rank and another
// while that lowers the pair's maximum: greedy packing alone leaves a few
// percent of imbalance when every rank must take the same number of slots.
void pack_by_load(const std::vector<Slot>& slots, const std::vector<int>& ranks, int capacity,
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

// Edges kept per slot: the strongest co-activations carry the partition, the
// weak tail mostly costs METIS time (a DeepSeek layer is a dense 256-vertex graph).
constexpr std::size_t kEdgesPerSlot = 16;
// Islands may carry this much more load per rank than the mean.
constexpr double kIslandTolerance = 0.02;

// One layer's slots and the co-activation between them: an expert pair's
// count shared evenly among their replicas (read once from the statistics).
struct LayerGraph {
  LayerGraph(const std::vector<Slot>& slots, const std::vector<int>& replicas,
             const routing::RoutingStats& stats, int layer)
      : slots(slots), replicas(replicas), experts(stats.experts()),
        coactivation(std::size_t(experts) * experts, 0.0) {
    for (int a = 0; a < experts; ++a)
      for (int b = a + 1; b < experts; ++b)
        coactivation[std::size_t(a) * experts + b] = coactivation[std::size_t(b) * experts + a] =
            stats.coactivation(layer, a, b);
  }
  double edge(std::size_t a, std::size_t b) const {
    const int ea = slots[a].expert, eb = slots[b].expert;
    return coactivation[std::size_t(ea) * experts + eb] / (replicas[ea] * replicas[eb]);
  }
  std::size_t size() const { return slots.size(); }

  const std::vector<Slot>& slots;
  const std::vector<int>& replicas;
  int experts;
  std::vector<double> coactivation;  // [a * experts + b], 0 on the diagonal
};

// Cuts the slots of one layer into islands with METIS: vertex weight the
// slot's load (targets by island size), edge weight co-activation (each
// slot's strongest kEdgesPerSlot edges, kept symmetric). Slot counts are
// fixed afterwards by repair_islands. Returns the island of each slot.
std::vector<int> partition_slots(const LayerGraph& g, int layer, const Topology& topology,
                                 std::uint64_t seed) {
  const std::vector<Slot>& slots = g.slots;
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
  for (const Slot& s : slots) max_load = std::max(max_load, s.load);
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
  std::vector<real_t> ubvec{1.02f};
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
      : island_(std::move(island)), slots_(g.slots), replicas_(g.replicas), I_(topology.islands()),
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
  // Replicas of an expert one island may hold: no more than its ranks, nor
  // than an even spread over islands (a replica is there for other islands).
  int allowed(int expert, int i) const { return std::min(ranks_[i], (replicas_[expert] + I_ - 1) / I_); }
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
  const std::vector<Slot>& slots_;
  const std::vector<int>& replicas_;
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
void balance_islands(IslandState& st, const std::vector<Slot>& slots, double tolerance) {
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

// Renames layer `layer`'s islands so that they follow layer - 1's by
// affinity (islands of equal size only).
void align_islands(std::vector<int>& island, const std::vector<Slot>& slots,
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
  std::vector<Slot> slots = make_slots(loads, replicas);
  std::vector<int> all_ranks(R);
  std::iota(all_ranks.begin(), all_ranks.end(), 0);
  if (o.policy == "greedy-load") return pack_by_load(slots, all_ranks, capacity, layer, p);

  const LayerGraph graph(slots, replicas, stats, layer);
  IslandState state(partition_slots(graph, layer, topology, o.seed + layer), graph, topology, capacity);
  repair_islands(state, layer);
  balance_islands(state, slots, kIslandTolerance);
  std::vector<int> island = state.islands();
  if (o.affinity && layer > 0) align_islands(island, slots, p, stats, layer, topology);
  for (int i = 0; i < topology.islands(); ++i) {
    std::vector<Slot> mine;
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

namespace {

// Groups the moves of one layer so that applying a group keeps every rank's
// slot count, except where the target itself changes it. A move is an edge
// drop -> to between ranks (-1: nowhere, for new replicas and releases);
// a group is a maximal chain grown from a move in both directions, each step
// taking a move that frees a slot where the chain fills one (forward) or
// fills a slot where it frees one (backward). Every rank a chain passes
// through keeps its count; a chain ends only where no move is left to pair
// with, i.e. where the target adds or removes slots, or at "nowhere".
std::vector<std::vector<Move>> group_moves(const std::vector<Move>& layer_moves) {
  const std::size_t n = layer_moves.size();
  std::vector<bool> used(n, false);
  auto take = [&](auto matches) -> std::size_t {
    for (std::size_t j = 0; j < n; ++j)
      if (!used[j] && matches(layer_moves[j])) return used[j] = true, j;
    return n;
  };
  std::vector<std::vector<Move>> groups;
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
