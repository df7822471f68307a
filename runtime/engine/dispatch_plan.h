// The pure middle of a layer's data path: which rank each (token, expert)
// pair goes to and by which route, the wire format of dispatch and combine,
// and how an expert's rows are cut into GEMM chunks. No MPI and no threads:
// unit-tested directly.
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
#include <vector>

#include "comm/transport.h"
#include "placement/placement.h"
#include "placement/topology.h"
#include "runtime/router/router.h"

namespace moed::runtime {

// Tokens routed to each expert of one layer, from each rank: [rank][expert].
class ExpertCounts {
 public:
  ExpertCounts() = default;
  ExpertCounts(int ranks, int experts) : ranks_(ranks), experts_(experts), counts_(std::size_t(ranks) * experts) {}
  // This rank's counts, the row it contributes to the all-gather.
  static std::vector<std::uint32_t> local(const Routing& routing, int experts);
  // The counts of tokens [first, first + n) of `routing` (one micro-batch).
  static std::vector<std::uint32_t> local(const Routing& routing, int experts, std::size_t first, std::size_t n);

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
};

// Index, in the expert's replica list, of the replica that computes chunk
// `chunk` of `expert` (rule 1 above).
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

// Row message wire format, one message per destination:
//   u32 rows, u32 pairs, u64 token[rows], u32 pairs_per_row[rows],
//   u32 experts[pairs], f32 weights[pairs], u32 dests[pairs], zero padding to
//   16 bytes, f32 rows x hidden, zero padding to 16 bytes (every message, and
//   so every field, stays aligned).
std::size_t row_message_bytes(std::size_t rows, std::size_t pairs, int hidden);
// Fills `buffer` and the send half of `layout` from one batch per rank; an
// empty batch is an empty message (0 bytes), and so is the batch to rank
// `skip` (this rank's own rows, which never travel).
void pack_rows(const std::vector<RowBatch>& batches, int hidden, std::vector<std::byte>& buffer,
               comm::ExchangeLayout& layout, int skip = -1);

// A view of received row messages, validated against their sizes.
struct ReceivedRows {
  struct Source {
    std::uint32_t rows = 0, pairs = 0;
    const std::uint64_t* token = nullptr;
    const std::uint32_t* pairs_per_row = nullptr;
    const std::uint32_t* experts = nullptr;
    const float* weights = nullptr;
    const std::uint32_t* dests = nullptr;
    const float* data = nullptr;            // rows x hidden
    const float* const* row_data = nullptr; // or a pointer per row (rows never packed)
    std::vector<std::uint32_t> first_pair;  // per row, index into experts/weights/dests
    std::vector<std::uint32_t> own_pairs;   // pairs_per_row's storage, for a view of a RowBatch

    const float* row(std::size_t r, int hidden) const {
      return row_data ? row_data[r] : data + r * std::size_t(hidden);
    }
  };
  std::vector<Source> from;  // per rank
};
ReceivedRows parse_rows(const std::byte* recv, const comm::ExchangeLayout& layout, int hidden);
// One message from `source` (0 bytes: no rows).
ReceivedRows::Source parse_row_message(const std::byte* message, std::size_t bytes, int hidden, int source);
// A batch this rank would send to itself, seen as received, without packing.
// The view points into `batch`, which must outlive it.
ReceivedRows::Source view_rows(const RowBatch& batch);

// Gateway: the hop-2 rows that forward the received hop-1 rows inside this
// rank's island, appended to `plan.hop2`. Gateway slot k is the k-th received
// hop-1 row, counting sources in rank order.
void plan_forward(const ReceivedRows& hop1, int hidden, DispatchPlan& plan);

// Combine wire format: each row is answered in the order it was received,
// as fp32 (the expert output, unweighted) when the row carried one pair and
// the experts have one canonical F-chunk, or as the fixed-point gate-weighted
// sum of its pairs otherwise (with more chunks an expert's output is a sum of
// chunk terms on the fixed grid, kernels/cpu/expert_ffn.h, which no fp32
// value carries). A fixed-point row is an 8-byte header (u32 bytes per
// element, 1 to 8; u32 zero), then the hidden sums, each as its low bytes
// (kernels/cpu/fixed_combine.h: narrow rows). Rows are padded to 8 bytes.
//
// Answers are laid out at full width (8 bytes per sum: what the experts
// write into, and what a receiver sizes for) and narrowed in place before
// they travel, so a message is at most its full-width size.
struct AnswerFormat {
  int hidden = 0;
  bool fp32_singles = true;  // [experts].ffn_chunks = 1
  // A hidden size alone: the format of one chunk.
  AnswerFormat(int hidden_size, bool fp32_single_answers = true)  // NOLINT: implicit on purpose
      : hidden(hidden_size), fp32_singles(fp32_single_answers) {}
  bool fp32(std::uint32_t pairs) const { return pairs == 1 && fp32_singles; }
};
inline constexpr std::size_t kFixedRowHeaderBytes = 8;
inline std::size_t pad8(std::size_t n) { return (n + 7) & ~std::size_t(7); }
inline std::size_t fixed_row_bytes(int hidden, int width) {
  return kFixedRowHeaderBytes + pad8(std::size_t(hidden) * std::size_t(width));
}
// A row's bytes at full width.
inline std::size_t combine_row_bytes(std::uint32_t pairs, AnswerFormat f) {
  return f.fp32(pairs) ? pad8(std::size_t(f.hidden) * sizeof(float)) : fixed_row_bytes(f.hidden, 8);
}
// The sums of a full-width fixed-point row that starts at `row`.
inline std::int64_t* fixed_row_sums(std::byte* row) {
  return reinterpret_cast<std::int64_t*>(row + kFixedRowHeaderBytes);
}
// Lays out the answers to `rows` rows of pairs_per_row[r] pairs at `block`:
// fp32 rows zero, fixed-point rows at full width with sums zero.
void lay_out_answers(std::byte* block, const std::uint32_t* pairs_per_row, std::size_t rows, AnswerFormat f);
// Narrows the fixed-point rows of a full-width message in place; returns the
// message's bytes now.
std::size_t narrow_answers(std::byte* block, const std::uint32_t* pairs_per_row, std::size_t rows, AnswerFormat f);
// Bytes of the answers to received rows, per source, and to sent rows, per destination.
std::vector<std::size_t> combine_message_bytes(const ReceivedRows& received, AnswerFormat f);
std::vector<std::size_t> combine_message_bytes(const std::vector<RowBatch>& sent, AnswerFormat f);

// A gateway's answers to its received hop-1 rows: the hop-1 combine message,
// filled from its island's hop-2 answers.
struct GatewayAnswers {
  std::vector<std::byte> send;
  comm::ExchangeLayout layout;             // send half
  std::vector<std::size_t> slot_offset;    // gateway slot -> byte offset in `send`
  std::vector<std::uint32_t> slot_pairs;   // gateway slot -> pairs of its hop-1 row
  std::vector<std::size_t> first_slot;     // per source, and one past the last: its slots
};
GatewayAnswers prepare_gateway_answers(const ReceivedRows& hop1, AnswerFormat f);
// Narrows each source's block in place (send_bytes shrink; offsets stay).
void narrow_gateway_answers(GatewayAnswers& g, AnswerFormat f);

// Adds the answers to rows this rank sent (`sent`, one batch per rank; the
// answers in `recv` laid out by `layout`, full width or narrowed): rows of
// local tokens into acc[local token][hidden], rows forwarded for a gateway
// slot into `gateway`. Returns the count of saturated fixed-point terms; a
// message that does not parse as the answers to `sent` is an error.
std::size_t accumulate_answers(const std::vector<RowBatch>& sent, const std::byte* recv,
                               const comm::ExchangeLayout& layout, AnswerFormat f, std::int64_t* acc,
                               GatewayAnswers* gateway);
// The same for the answers from one rank: `block` holds `bytes` of answers to
// `sent`; `row_bytes`, if given, gets each row's bytes as it came.
std::size_t accumulate_answer_block(const RowBatch& sent, const std::byte* block, std::size_t bytes, AnswerFormat f,
                                    std::int64_t* acc, GatewayAnswers* gateway, int from,
                                    std::vector<std::uint32_t>* row_bytes = nullptr);

}  // namespace moed::runtime
