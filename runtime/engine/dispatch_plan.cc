#include "runtime/engine/dispatch_plan.h"

#include <algorithm>

#include "common/error.h"
#include "runtime/engine/wire_format.h"

namespace moed::runtime {

std::vector<std::uint32_t> ExpertCounts::local(const Routing& routing, int experts) {
  return local(routing, experts, 0, routing.tokens());
}

std::vector<std::uint32_t> ExpertCounts::local(const Routing& routing, int experts, std::size_t first,
                                               std::size_t n) {
  std::vector<std::uint32_t> counts(experts, 0);
  count(routing, first, n, counts);
  return counts;
}

void ExpertCounts::count(const Routing& routing, std::size_t first, std::size_t n, std::span<std::uint32_t> counts) {
  std::fill(counts.begin(), counts.end(), 0u);
  for (std::uint32_t i = routing.offsets[first]; i < routing.offsets[first + n]; ++i) {
    const std::uint32_t e = routing.experts[i];
    MOED_CHECK(e < counts.size(), "routing names expert {} of {}", e, counts.size());
    ++counts[e];
  }
}

std::uint64_t ExpertCounts::total(int expert) const {
  std::uint64_t n = 0;
  for (int r = 0; r < ranks_; ++r) n += at(r, expert);
  return n;
}

std::uint64_t ExpertCounts::before(int rank, int expert) const {
  std::uint64_t n = 0;
  for (int r = 0; r < rank; ++r) n += at(r, expert);
  return n;
}

std::uint64_t expert_chunk_rows(const PlanInput& in, int expert) {
  const std::uint64_t n = std::uint64_t(in.placement->copies(in.layer, expert));
  if (!in.share_small_experts || n < 2) return in.chunk_rows;
  const std::uint64_t shared = (in.counts->total(expert) + n - 1) / n;
  return std::clamp<std::uint64_t>(shared, 1, in.chunk_rows);
}

std::size_t chunk_replica(const PlanInput& in, int expert, std::uint64_t chunk) {
  const std::size_t copies = std::size_t(in.placement->copies(in.layer, expert));
  if (copies == 1) return 0;
  if (!in.topology || in.topology->islands() == 1) return replica_of_chunk(chunk, in.step, copies);
  // Rows of the chunk per island: rank r holds positions [before(r), before(r) + at(r)).
  const std::uint64_t C = expert_chunk_rows(in, expert), lo = chunk * C, hi = lo + C;
  std::vector<std::uint64_t> rows(in.topology->islands(), 0);
  std::uint64_t start = 0;
  for (int r = 0; r < in.counts->ranks(); ++r) {
    const std::uint64_t end = start + in.counts->at(r, expert);
    if (end > lo && start < hi) rows[in.topology->island_of(r)] += std::min(end, hi) - std::max(start, lo);
    start = end;
  }
  const int island = int(std::max_element(rows.begin(), rows.end()) - rows.begin());
  std::vector<std::size_t> near;  // a copy's shards share an island (shard_rules.h)
  for (std::size_t c = 0; c < copies; ++c)
    if (in.topology->island_of(in.placement->copy(in.layer, expert, int(c))[0]) == island) near.push_back(c);
  if (near.empty()) return replica_of_chunk(chunk, in.step, copies);
  return near[replica_of_chunk(chunk, in.step, near.size())];
}

std::vector<std::uint64_t> pairs_to_ranks(const PlanInput& in, int home) {
  std::vector<std::uint64_t> pairs(std::size_t(in.counts->ranks()), 0);
  for (int e = 0; e < in.counts->experts(); ++e) {
    const std::uint64_t n = in.counts->at(home, e);
    if (n == 0) continue;
    if (in.placement->copies(in.layer, e) == 1) {  // every shard takes every row
      for (int r : in.placement->replicas(in.layer, e)) pairs[r] += n;
      continue;
    }
    // The home's pairs hold positions [lo, hi) of the expert's rows; each
    // chunk they overlap goes to every rank of its copy.
    const std::uint64_t lo = in.counts->before(home, e), hi = lo + n, C = expert_chunk_rows(in, e);
    for (std::uint64_t j = lo / C; j * C < hi; ++j)
      for (int r : in.placement->copy(in.layer, e, int(chunk_replica(in, e, j))))
        pairs[r] += std::min(hi, (j + 1) * C) - std::max(lo, j * C);
  }
  return pairs;
}

int gateway(const placement::Topology& topology, int home, int island) {
  const std::vector<int> mine = topology.ranks_in(topology.island_of(home));
  const std::size_t index = std::size_t(std::find(mine.begin(), mine.end(), home) - mine.begin());
  const std::vector<int> there = topology.ranks_in(island);
  return there[index % there.size()];
}

void RowBatch::add(std::uint64_t token_id, std::int64_t from, const float* row_data,
                   std::uint32_t expert, float weight, std::uint32_t dest) {
  if (token.empty() || token.back() != token_id) {  // a new row: the token travels once
    token.push_back(token_id);
    origin.push_back(from);
    data.push_back(row_data);
    pair_offsets.push_back(pair_offsets.back());
  }
  experts.push_back(expert);
  weights.push_back(weight);
  dests.push_back(dest);
  ++pair_offsets.back();
}

DispatchPlan plan_dispatch(const PlanInput& in, const float* x, int hidden) {
  const Routing& routing = *in.routing;
  const placement::Placement& placement = *in.placement;
  const bool via_gateways = in.hierarchical && in.topology && in.topology->islands() > 1;
  const int home_island = via_gateways ? in.topology->island_of(in.rank) : 0;
  DispatchPlan plan;
  plan.hop1.resize(placement.ranks());
  plan.hop2.resize(placement.ranks());
  const int E = placement.experts();
  std::vector<std::uint64_t> seen(E, 0);  // my pairs per expert so far
  // Per expert, once: its copies, and the ranks of the copy its current
  // chunk goes to (a chunk's copy, remembered: an expert's pairs come in
  // position order).
  std::vector<int> copies(E);
  std::vector<std::span<const int>> dests(E);
  for (int e = 0; e < E; ++e) copies[e] = placement.copies(in.layer, e), dests[e] = placement.copy(in.layer, e, 0);
  std::vector<std::uint64_t> cached_chunk(E, UINT64_MAX);
  std::vector<std::uint64_t> chunk_rows(E, 0);  // expert_chunk_rows, once per expert
  // The batch a pair for `dest` joins: direct within the home's island, else the gateway's.
  auto route = [&](int dest) -> RowBatch& {
    const int dest_island = via_gateways ? in.topology->island_of(dest) : 0;
    return dest_island == home_island ? plan.hop2[dest] : plan.hop1[gateway(*in.topology, in.rank, dest_island)];
  };
  const std::size_t end = std::min(routing.tokens(), in.rows == SIZE_MAX ? SIZE_MAX : in.first_row + in.rows);
  for (std::size_t t = in.first_row; t < end; ++t) {
    auto experts = routing.experts_of(t);
    auto weights = routing.weights_of(t);
    const float* row = x + t * std::size_t(hidden);
    for (std::size_t i = 0; i < experts.size(); ++i) {
      const int e = int(experts[i]);
      MOED_CHECK(e < E, "routing names expert {} of {}", e, E);
      if (copies[e] > 1) {
        if (!chunk_rows[e]) chunk_rows[e] = expert_chunk_rows(in, e);
        std::uint64_t chunk = (in.counts->before(in.rank, e) + seen[e]) / chunk_rows[e];
        if (cached_chunk[e] != chunk)
          cached_chunk[e] = chunk, dests[e] = placement.copy(in.layer, e, int(chunk_replica(in, e, chunk)));
      }
      ++seen[e];
      // A pair per rank of the copy: one for a whole expert, one per shard of
      // a split one (the shards share an island, so a remote one's row
      // crosses once, to the gateway, which fans it out).
      for (int dest : dests[e])
        route(dest).add(in.first_token + t, std::int64_t(t), row, experts[i], weights[i], std::uint32_t(dest));
    }
  }
  return plan;
}

void plan_forward(const ReceivedRows& hop1, int hidden, DispatchPlan& plan) {
  std::int64_t slot = 0;
  for (const auto& src : hop1.from) {
    for (std::uint32_t r = 0; r < src.rows; ++r, ++slot) {
      const float* row = src.row(r, hidden);
      for (std::uint32_t p = src.first_pair[r]; p < src.first_pair[r] + src.pairs_per_row[r]; ++p) {
        const std::uint32_t dest = src.dests[p];
        MOED_CHECK(dest < plan.hop2.size(), "hop-1 row for rank {}", dest);
        plan.hop2[dest].add(src.token[r], -(slot + 1), row, src.experts[p], src.weights[p], dest);
      }
    }
  }
}

}  // namespace moed::runtime
