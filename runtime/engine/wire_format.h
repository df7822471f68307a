// The wire formats of a layer's exchanges, as bytes (no MPI, no threads;
// unit-tested directly): the row messages a rank sends the ranks that
// compute (and a gateway forwards), the answers that come back (fp32, or
// fixed-point sums narrowed row by row), a gateway's answers to the rows it
// forwarded, and the sums a home adds them into. What goes where is decided
// in dispatch_plan.h.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "comm/transport.h"
#include "runtime/engine/dispatch_plan.h"

namespace moed::runtime {

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
  explicit AnswerFormat(int hidden_size, bool fp32_single_answers = true)
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
// `sent`.
std::size_t accumulate_answer_block(const RowBatch& sent, const std::byte* block, std::size_t bytes, AnswerFormat f,
                                    std::int64_t* acc, GatewayAnswers* gateway, int from);
// Each row's bytes in such a block, as it came (answers narrow on the wire).
void answer_row_bytes(const RowBatch& sent, const std::byte* block, std::size_t bytes, AnswerFormat f, int from,
                      std::vector<std::uint32_t>& row_bytes);

}  // namespace moed::runtime
