// The pure middle of a layer's data path: which rank each (token, expert)
// pair goes to and by which route, and how an expert's rows are cut into
// GEMM chunks (the messages that carry them: wire_format.h). No MPI and no
// threads: unit-tested directly.
//
// Bit-exactness rests on two rules stated here once:
//  1. An expert's rows of a step, ordered by global token id, are cut into
//     chunks of C rows (chunk j holds positions [jC, jC + C); C is the
//     expert's, expert_chunk_rows); each chunk is one GEMM call wherever it
//     runs. An expert held once computes all its chunks; with several
//     copies (replicas, or groups of shards: placement.h) each chunk goes
//     to one copy, chosen near the chunk's rows: among the copies on the
//     island most of its rows come from (all copies if none is there), the
//     (j + step) mod n-th. Every shard of that copy computes the chunk (its
//     F/S of the FFN). Every rank derives this from the all-gathered
//     per-expert counts, so the home rank knows where each pair goes and
//     the expert knows its chunks.
//  2. Partial sums are exact fixed point (kernels/cpu/fixed_combine.h), so
//     where and in what order they are added does not matter.
//
// Routes. A token travels once to each rank that holds any of its experts.
// Flat dispatch sends it there directly. Hierarchical dispatch sends it once
// to each remote island, to a gateway rank there (the rank with the home
// rank's index within its island, modulo the island's size), which forwards
// it inside its island (hop 2, as the home rank does for its own island); the
// combine runs backwards, the gateway summing its island's partial results
// before the single return crossing.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "placement/placement.h"
#include "placement/topology.h"
#include "runtime/router/router.h"

namespace moed::runtime {

struct ReceivedRows;  // wire_format.h

// Tokens routed to each expert of one layer, from each rank: [rank][expert].
class ExpertCounts {
 public:
  ExpertCounts() = default;
  ExpertCounts(int ranks, int experts) : ranks_(ranks), experts_(experts), counts_(std::size_t(ranks) * experts) {}
  // This rank's counts, the row it contributes to the all-gather.
  static std::vector<std::uint32_t> local(const Routing& routing, int experts);
  // The counts of tokens [first, first + n) of `routing` (one micro-batch).
  static std::vector<std::uint32_t> local(const Routing& routing, int experts, std::size_t first, std::size_t n);
  // The same into `counts`, one per expert.
  static void count(const Routing& routing, std::size_t first, std::size_t n, std::span<std::uint32_t> counts);

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

struct PlanInput {
  const Routing* routing = nullptr;
  const placement::Placement* placement = nullptr;
  int layer = 0;
  const ExpertCounts* counts = nullptr;
  int rank = 0;
  std::uint64_t chunk_rows = 1;
  std::uint64_t step = 0;
  const placement::Topology* topology = nullptr;  // none: one island, replicas rotate
  bool hierarchical = false;                      // route through gateways (needs a topology)
  // Step-wide key of this rank's token 0 (step x T + its first position):
  // tokens are keyed by position, so an expert's rows are ordered alike on
  // every rank, whichever token sits at a position.
  std::uint64_t first_token = 0;
  // The tokens of `routing` this plan covers (a micro-batch): [first_row,
  // first_row + rows); token t's key is first_token + t.
  std::size_t first_row = 0, rows = SIZE_MAX;
  // A replicated expert with fewer rows than replicas x chunk_rows is cut
  // into one chunk per replica instead, so that its replicas share its rows
  // at decode sizes. Only where a row's bits do not depend on the rows that
  // share its GEMM call (the fixed-order GEMM): chunks then follow the
  // placement.
  bool share_small_experts = false;
};

// C of rule 1 for `expert`: in.chunk_rows, or with in.share_small_experts,
// for an expert with several copies, its rows this step divided among its
// copies (rounded up, at least 1) where that is smaller.
std::uint64_t expert_chunk_rows(const PlanInput& in, int expert);

// The copy (placement.h: a replica, or a group of shards) that computes
// chunk `chunk` of `expert` (rule 1 above).
std::size_t chunk_replica(const PlanInput& in, int expert, std::uint64_t chunk);

// The pairs that `home` sends to each rank (their final destinations), from
// the all-gathered counts alone: every rank can size what it will receive.
std::vector<std::uint64_t> pairs_to_ranks(const PlanInput& in, int home);

// The gateway of `island` for tokens whose home is `home`.
int gateway(const placement::Topology& topology, int home, int island);

// Rows bound for one rank, one row per token: its global id, its pairs
// (expert, gate weight, the rank that computes it), where its data is, and
// what its answer is for (a local token, or a gateway slot).
struct RowBatch {
  std::vector<std::uint64_t> token;
  std::vector<std::int64_t> origin;   // >= 0: local token index; < 0: gateway slot -(origin + 1)
  std::vector<const float*> data;     // the row's hidden state (H floats), until packed
  std::vector<std::uint32_t> pair_offsets{0};
  std::vector<std::uint32_t> experts;
  std::vector<float> weights;
  std::vector<std::uint32_t> dests;

  std::size_t rows() const { return token.size(); }
  std::uint32_t pairs_of(std::size_t row) const { return pair_offsets[row + 1] - pair_offsets[row]; }
  // Adds a pair to row `token` (a new row unless the last row is that token's).
  void add(std::uint64_t token_id, std::int64_t from, const float* row_data, std::uint32_t expert,
           float weight, std::uint32_t dest);
};

// What one rank sends in a layer: per rank, hop 1 (to gateways, across
// islands; empty when flat) and hop 2 (to the ranks that compute).
struct DispatchPlan {
  std::vector<RowBatch> hop1, hop2;
};

// The home rank's plan for its tokens; `x` holds their normalised rows.
DispatchPlan plan_dispatch(const PlanInput& in, const float* x, int hidden);

// Gateway: the hop-2 rows that forward the received hop-1 rows inside this
// rank's island, appended to `plan.hop2`. Gateway slot k is the k-th received
// hop-1 row, counting sources in rank order.
void plan_forward(const ReceivedRows& hop1, int hidden, DispatchPlan& plan);

}  // namespace moed::runtime
