#include "runtime/dispatch_plan.h"

#include <cstring>

#include "common/error.h"
#include "kernels/cpu/fixed_combine.h"

namespace moed::runtime {

namespace {

std::size_t pad16(std::size_t n) { return (n + 15) & ~std::size_t(15); }

template <class T>
void put(std::byte*& p, const T* src, std::size_t n) {
  if (n) std::memcpy(p, src, n * sizeof(T));
  p += n * sizeof(T);
}

}  // namespace

std::vector<std::uint32_t> ExpertCounts::local(const Routing& routing, int experts) {
  std::vector<std::uint32_t> counts(experts, 0);
  for (std::uint32_t e : routing.experts) ++counts.at(e);
  return counts;
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

std::size_t chunk_replica(const PlanInput& in, int expert, std::uint64_t chunk) {
  const std::vector<int>& replicas = in.placement->replicas(in.layer, expert);
  if (replicas.size() == 1) return 0;
  if (!in.topology || in.topology->islands() == 1)
    return replica_of_chunk(chunk, in.step, replicas.size());
  // Rows of the chunk per island: rank r holds positions [before(r), before(r) + at(r)).
  const std::uint64_t lo = chunk * in.chunk_rows, hi = lo + in.chunk_rows;
  std::vector<std::uint64_t> rows(in.topology->islands(), 0);
  std::uint64_t start = 0;
  for (int r = 0; r < in.counts->ranks(); ++r) {
    const std::uint64_t end = start + in.counts->at(r, expert);
    if (end > lo && start < hi) rows[in.topology->island_of(r)] += std::min(end, hi) - std::max(start, lo);
    start = end;
  }
  const int island = int(std::max_element(rows.begin(), rows.end()) - rows.begin());
  std::vector<std::size_t> near;
  for (std::size_t i = 0; i < replicas.size(); ++i)
    if (in.topology->island_of(replicas[i]) == island) near.push_back(i);
  if (near.empty()) return replica_of_chunk(chunk, in.step, replicas.size());
  return near[replica_of_chunk(chunk, in.step, near.size())];
}

DispatchPlan plan_dispatch(const PlanInput& in) {
  const Routing& routing = *in.routing;
  const placement::Placement& placement = *in.placement;
  DispatchPlan plan;
  plan.to.resize(placement.ranks());
  std::vector<std::uint64_t> seen(placement.experts(), 0);  // my pairs per expert so far
  // A chunk's replica, remembered: an expert's pairs come in position order.
  std::vector<std::uint64_t> cached_chunk(placement.experts(), UINT64_MAX);
  std::vector<int> cached_dest(placement.experts(), -1);
  for (std::size_t t = 0; t < routing.tokens(); ++t) {
    auto experts = routing.experts_of(t);
    auto weights = routing.weights_of(t);
    for (std::size_t i = 0; i < experts.size(); ++i) {
      int e = int(experts[i]);
      const std::vector<int>& replicas = placement.replicas(in.layer, e);
      int dest = replicas[0];
      if (replicas.size() > 1) {
        std::uint64_t chunk = (in.counts->before(in.rank, e) + seen[e]) / in.chunk_rows;
        if (cached_chunk[e] != chunk)
          cached_chunk[e] = chunk, cached_dest[e] = replicas[chunk_replica(in, e, chunk)];
        dest = cached_dest[e];
      }
      ++seen[e];
      DispatchPlan::Destination& d = plan.to[dest];
      if (d.tokens.empty() || d.tokens.back() != t) {  // a new row: the token travels once
        d.tokens.push_back(std::uint32_t(t));
        d.pair_offsets.push_back(d.pair_offsets.back());
      }
      d.experts.push_back(experts[i]);
      d.weights.push_back(weights[i]);
      ++d.pair_offsets.back();
    }
  }
  return plan;
}

std::size_t dispatch_message_bytes(std::size_t rows, std::size_t pairs, int hidden) {
  return pad16(sizeof(std::uint32_t) * (2 + rows + pairs) + sizeof(float) * pairs) +
         pad16(sizeof(float) * rows * hidden);
}

void pack_dispatch(const DispatchPlan& plan, const float* x, int hidden, std::vector<std::byte>& buffer,
                   comm::ExchangeLayout& layout) {
  const std::size_t ranks = plan.to.size();
  layout.send_bytes.resize(ranks);
  for (std::size_t d = 0; d < ranks; ++d)
    layout.send_bytes[d] = dispatch_message_bytes(plan.to[d].tokens.size(), plan.to[d].experts.size(), hidden);
  layout.send_offsets = comm::ExchangeLayout::prefix_offsets(layout.send_bytes);
  buffer.resize(layout.send_total());
  for (std::size_t d = 0; d < ranks; ++d) {
    const auto& dest = plan.to[d];
    std::byte* start = buffer.data() + layout.send_offsets[d];
    std::byte* p = start;
    std::uint32_t header[2] = {std::uint32_t(dest.tokens.size()), std::uint32_t(dest.experts.size())};
    put(p, header, 2);
    for (std::size_t r = 0; r < dest.tokens.size(); ++r) {
      std::uint32_t n = dest.pairs_of(r);
      put(p, &n, 1);
    }
    put(p, dest.experts.data(), dest.experts.size());
    put(p, dest.weights.data(), dest.weights.size());
    std::byte* data = start + pad16(std::size_t(p - start));
    std::memset(p, 0, std::size_t(data - p));
    for (std::size_t r = 0; r < dest.tokens.size(); ++r)
      std::memcpy(data + r * hidden * sizeof(float), x + std::size_t(dest.tokens[r]) * hidden,
                  hidden * sizeof(float));
    std::byte* end = data + dest.tokens.size() * hidden * sizeof(float);
    std::memset(end, 0, std::size_t(start + layout.send_bytes[d] - end));
  }
}

ReceivedRows parse_dispatch(const std::byte* recv, const comm::ExchangeLayout& layout, int hidden) {
  ReceivedRows out;
  out.from.resize(layout.recv_bytes.size());
  for (std::size_t s = 0; s < layout.recv_bytes.size(); ++s) {
    const std::byte* start = recv + layout.recv_offsets[s];
    const std::size_t bytes = layout.recv_bytes[s];
    auto& src = out.from[s];
    MOED_CHECK(bytes >= 2 * sizeof(std::uint32_t), "dispatch message from rank {} has {} bytes", s, bytes);
    std::uint32_t header[2];
    std::memcpy(header, start, sizeof header);
    src.rows = header[0];
    src.pairs = header[1];
    MOED_CHECK(bytes == dispatch_message_bytes(src.rows, src.pairs, hidden),
               "dispatch message from rank {}: {} bytes for {} rows and {} pairs", s, bytes, src.rows,
               src.pairs);
    // The header fields are 4-byte aligned within a 16-byte aligned message.
    src.pairs_per_row = reinterpret_cast<const std::uint32_t*>(start) + 2;
    src.experts = src.pairs_per_row + src.rows;
    src.weights = reinterpret_cast<const float*>(src.experts + src.pairs);
    src.data = reinterpret_cast<const float*>(
        start + pad16(sizeof(std::uint32_t) * (2 + src.rows + src.pairs) + sizeof(float) * src.pairs));
    src.first_pair.resize(src.rows);
    std::uint32_t next = 0;
    for (std::uint32_t r = 0; r < src.rows; ++r) {
      src.first_pair[r] = next;
      MOED_CHECK(src.pairs_per_row[r] >= 1, "dispatch row {} from rank {} has no pair", r, s);
      next += src.pairs_per_row[r];
    }
    MOED_CHECK(next == src.pairs, "dispatch message from rank {}: rows hold {} pairs, header says {}",
               s, next, src.pairs);
  }
  return out;
}

std::vector<ExpertBatch> batch_by_expert(const ReceivedRows& received, const PlanInput& in) {
  const placement::Placement& placement = *in.placement;
  std::vector<int> local = placement.experts_on(in.layer, in.rank);
  std::vector<int> slot_of(placement.experts(), -1);
  std::vector<ExpertBatch> batches(local.size());
  for (std::size_t i = 0; i < local.size(); ++i) {
    slot_of[local[i]] = int(i);
    batches[i].expert = local[i];
  }
  // Sources in rank order and rows in token order: global token order.
  for (std::uint32_t s = 0; s < received.from.size(); ++s) {
    const auto& src = received.from[s];
    for (std::uint32_t r = 0; r < src.rows; ++r) {
      for (std::uint32_t p = src.first_pair[r]; p < src.first_pair[r] + src.pairs_per_row[r]; ++p) {
        std::uint32_t e = src.experts[p];
        MOED_CHECK(e < slot_of.size() && slot_of[e] >= 0,
                   "rank {} received a row for expert {} of layer {}, which it does not hold", in.rank, e,
                   in.layer);
        batches[slot_of[e]].rows.push_back({s, r, p});
      }
    }
  }
  // The chunks this rank computes, and a check that exactly their rows arrived.
  for (auto& b : batches) {
    const std::vector<int>& replicas = placement.replicas(in.layer, b.expert);
    std::size_t mine = 0;
    while (replicas[mine] != in.rank) ++mine;
    std::uint64_t total = in.counts->total(b.expert);
    std::uint64_t expected = 0;
    for (std::uint64_t j = 0; j * in.chunk_rows < total; ++j) {
      if (chunk_replica(in, b.expert, j) != mine) continue;
      std::uint64_t size = std::min(in.chunk_rows, total - j * in.chunk_rows);
      b.chunk_rows.push_back(std::uint32_t(size));
      expected += size;
    }
    MOED_CHECK(expected == b.rows.size(),
               "layer {} expert {}: rank {} received {} rows, its chunks hold {}", in.layer, b.expert,
               in.rank, b.rows.size(), expected);
  }
  return batches;
}

std::vector<std::size_t> combine_message_bytes(const ReceivedRows& received, int hidden) {
  std::vector<std::size_t> bytes(received.from.size(), 0);
  for (std::size_t s = 0; s < received.from.size(); ++s)
    for (std::uint32_t r = 0; r < received.from[s].rows; ++r)
      bytes[s] += combine_row_bytes(received.from[s].pairs_per_row[r], hidden);
  return bytes;
}

std::vector<std::size_t> combine_message_bytes(const DispatchPlan& plan, int hidden) {
  std::vector<std::size_t> bytes(plan.to.size(), 0);
  for (std::size_t d = 0; d < plan.to.size(); ++d)
    for (std::size_t r = 0; r < plan.to[d].tokens.size(); ++r)
      bytes[d] += combine_row_bytes(plan.to[d].pairs_of(r), hidden);
  return bytes;
}

std::size_t accumulate_returns(const DispatchPlan& plan, const std::byte* recv,
                               const comm::ExchangeLayout& layout, int hidden, std::int64_t* acc) {
  std::size_t saturated = 0;
  for (std::size_t d = 0; d < plan.to.size(); ++d) {
    const auto& dest = plan.to[d];
    const std::byte* p = recv + layout.recv_offsets[d];
    for (std::size_t r = 0; r < dest.tokens.size(); ++r) {
      std::int64_t* a = acc + std::size_t(dest.tokens[r]) * hidden;
      if (dest.pairs_of(r) == 1) {
        // One expert on that rank: weight its output here, as the expert rank would have.
        saturated += kernels::add_weighted_fixed(a, reinterpret_cast<const float*>(p),
                                                 dest.weights[dest.pair_offsets[r]], hidden);
      } else {
        kernels::add_fixed(a, reinterpret_cast<const std::int64_t*>(p), hidden);
      }
      p += combine_row_bytes(dest.pairs_of(r), hidden);
    }
    MOED_CHECK(std::size_t(p - (recv + layout.recv_offsets[d])) == layout.recv_bytes[d],
               "combine message from rank {}: {} bytes, expected {}", d,
               layout.recv_bytes[d], std::size_t(p - (recv + layout.recv_offsets[d])));
  }
  return saturated;
}

}  // namespace moed::runtime
