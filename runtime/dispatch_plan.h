// The pure middle of a layer's data path: which rank each (token, expert)
// pair goes to, the wire format of dispatch and combine, and how an expert's
// rows are cut into GEMM chunks. No MPI and no threads: unit-tested directly.
//
// Bit-exactness rests on two rules stated here once:
//  1. An expert's rows of a step, ordered by global token id, are cut into
//     chunks of C rows (chunk j holds positions [jC, jC + C)); each chunk is one
//     GEMM call wherever it runs. Without replicas an expert computes all its
//     chunks; with replicas each chunk goes to one replica, chosen near the
//     chunk's rows: among the replicas on the island most of its rows come
//     from (all replicas if none is there), the (j + step) mod n-th. Every
//     rank derives this from the all-gathered per-expert counts, so the
//     home rank knows where each pair goes and the expert knows its chunks.
//  2. Partial sums are exact fixed point (kernels/cpu/fixed_combine.h), so
//     where and in what order they are added does not matter.
// A token travels once to each rank that holds any of its experts.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "comm/transport.h"
#include "placement/placement.h"
#include "placement/topology.h"
#include "runtime/router.h"

namespace moed::runtime {

// Tokens routed to each expert of one layer, from each rank: [rank][expert].
class ExpertCounts {
 public:
  ExpertCounts() = default;
  ExpertCounts(int ranks, int experts) : ranks_(ranks), experts_(experts), counts_(std::size_t(ranks) * experts) {}
  // This rank's counts, the row it contributes to the all-gather.
  static std::vector<std::uint32_t> local(const Routing& routing, int experts);

  std::uint32_t* data() { return counts_.data(); }
  int ranks() const { return ranks_; }
  int experts() const { return experts_; }
  std::uint32_t at(int rank, int expert) const { return counts_[std::size_t(rank) * experts_ + expert]; }
  std::uint64_t total(int expert) const;
  std::uint64_t before(int rank, int expert) const;  // sum over ranks below `rank`

 private:
  int ranks_ = 0, experts_ = 0;
  std::vector<std::uint32_t> counts_;
};

// Among n candidate replicas, the one that computes chunk `chunk`: rotating
// with the step spreads an expert's single chunk over its replicas in time.
inline std::size_t replica_of_chunk(std::uint64_t chunk, std::uint64_t step, std::size_t n) {
  return std::size_t((chunk + step) % n);
}

// What the home rank sends: per destination, rows (one per token) in token order.
struct DispatchPlan {
  struct Destination {
    std::vector<std::uint32_t> tokens;            // local token index of each row
    std::vector<std::uint32_t> pair_offsets{0};   // row r's pairs: [pair_offsets[r], pair_offsets[r+1])
    std::vector<std::uint32_t> experts;
    std::vector<float> weights;
    std::uint32_t pairs_of(std::size_t row) const { return pair_offsets[row + 1] - pair_offsets[row]; }
  };
  std::vector<Destination> to;  // per rank
};

struct PlanInput {
  const Routing* routing = nullptr;
  const placement::Placement* placement = nullptr;
  int layer = 0;
  const ExpertCounts* counts = nullptr;
  int rank = 0;
  std::uint64_t chunk_rows = 1;
  std::uint64_t step = 0;
  const placement::Topology* topology = nullptr;  // none: replicas rotate, islands ignored
};
DispatchPlan plan_dispatch(const PlanInput& in);

// Index, in the expert's replica list, of the replica that computes chunk
// `chunk` of `expert` (rule 1 above).
std::size_t chunk_replica(const PlanInput& in, int expert, std::uint64_t chunk);

// Dispatch wire format, one message per destination:
//   u32 rows, u32 pairs, u32 pairs_per_row[rows], u32 experts[pairs], f32 weights[pairs],
//   zero padding to 16 bytes, f32 rows x hidden (the normalised token rows),
//   zero padding to 16 bytes (so every message, hence every field, is aligned).
std::size_t dispatch_message_bytes(std::size_t rows, std::size_t pairs, int hidden);
// Fills `buffer` and the send half of `layout`. `x` holds the local tokens' rows.
void pack_dispatch(const DispatchPlan& plan, const float* x, int hidden, std::vector<std::byte>& buffer,
                   comm::ExchangeLayout& layout);

// A view of the received dispatch messages, validated against their sizes.
struct ReceivedRows {
  struct Source {
    std::uint32_t rows = 0, pairs = 0;
    const std::uint32_t* pairs_per_row = nullptr;
    const std::uint32_t* experts = nullptr;
    const float* weights = nullptr;
    const float* data = nullptr;               // rows x hidden
    std::vector<std::uint32_t> first_pair;     // per row, index into experts/weights
  };
  std::vector<Source> from;  // per rank
};
ReceivedRows parse_dispatch(const std::byte* recv, const comm::ExchangeLayout& layout, int hidden);

// Combine wire format: each received row answered in the same order, as fp32
// (the expert output, unweighted) when the row carried one pair, or as the
// int64 fixed-point gate-weighted sum of its pairs otherwise.
// Rows are padded to 8 bytes so the int64 rows stay aligned.
inline std::size_t combine_row_bytes(std::uint32_t pairs, int hidden) {
  return pairs == 1 ? (std::size_t(hidden) * sizeof(float) + 7) & ~std::size_t(7)
                    : std::size_t(hidden) * sizeof(std::int64_t);
}

// One local expert's rows, in global token order, and its chunks.
struct ExpertBatch {
  int expert = 0;
  struct Row {
    std::uint32_t source, row, pair;
  };
  std::vector<Row> rows;
  std::vector<std::uint32_t> chunk_rows;  // sizes, in order; they sum to rows.size()
};
// Groups received pairs by local expert and derives each expert's chunks;
// Internal error when the rows received disagree with the counts.
std::vector<ExpertBatch> batch_by_expert(const ReceivedRows& received, const PlanInput& in);

// Byte offsets of each returned row per source (or destination), by pair counts.
std::vector<std::size_t> combine_message_bytes(const ReceivedRows& received, int hidden);
std::vector<std::size_t> combine_message_bytes(const DispatchPlan& plan, int hidden);

// Home side: adds every returned row into acc[local tokens][hidden] (fixed point).
// Returns the count of saturated terms.
std::size_t accumulate_returns(const DispatchPlan& plan, const std::byte* recv,
                               const comm::ExchangeLayout& layout, int hidden, std::int64_t* acc);

}  // namespace moed::runtime
