#include "runtime/engine/wire_format.h"

#include <cstring>

#include "common/error.h"
#include "kernels/cpu/fixed_combine.h"

namespace moed::runtime {

namespace {

std::size_t pad16(std::size_t n) { return (n + 15) & ~std::size_t(15); }

std::size_t row_header_bytes(std::size_t rows, std::size_t pairs) {
  return pad16(2 * sizeof(std::uint32_t) + rows * (sizeof(std::uint64_t) + sizeof(std::uint32_t)) +
               pairs * (2 * sizeof(std::uint32_t) + sizeof(float)));
}

template <class T>
void put(std::byte*& p, const T* src, std::size_t n) {
  if (n) std::memcpy(p, src, n * sizeof(T));
  p += n * sizeof(T);
}

}  // namespace

std::size_t row_message_bytes(std::size_t rows, std::size_t pairs, int hidden) {
  return row_header_bytes(rows, pairs) + pad16(sizeof(float) * rows * std::size_t(hidden));
}

void pack_rows(const std::vector<RowBatch>& batches, int hidden, std::vector<std::byte>& buffer,
               comm::ExchangeLayout& layout, int skip) {
  const std::size_t ranks = batches.size();
  layout.send_bytes.resize(ranks);
  for (std::size_t d = 0; d < ranks; ++d)
    layout.send_bytes[d] = batches[d].rows() == 0 || int(d) == skip
                               ? 0
                               : row_message_bytes(batches[d].rows(), batches[d].experts.size(), hidden);
  layout.send_offsets = comm::ExchangeLayout::prefix_offsets(layout.send_bytes);
  buffer.resize(layout.send_total());
  const std::size_t row_bytes = std::size_t(hidden) * sizeof(float);
  for (std::size_t d = 0; d < ranks; ++d) {
    if (layout.send_bytes[d] == 0) continue;
    const RowBatch& b = batches[d];
    std::byte* start = buffer.data() + layout.send_offsets[d];
    std::byte* p = start;
    const std::uint32_t header[2] = {std::uint32_t(b.rows()), std::uint32_t(b.experts.size())};
    put(p, header, 2);
    put(p, b.token.data(), b.rows());
    for (std::size_t r = 0; r < b.rows(); ++r) {
      const std::uint32_t n = b.pairs_of(r);
      put(p, &n, 1);
    }
    put(p, b.experts.data(), b.experts.size());
    put(p, b.weights.data(), b.weights.size());
    put(p, b.dests.data(), b.dests.size());
    std::byte* data = start + row_header_bytes(b.rows(), b.experts.size());
    std::memset(p, 0, std::size_t(data - p));
    for (std::size_t r = 0; r < b.rows(); ++r) {
      MOED_CHECK(b.data[r], "row {} to rank {} has no data", r, d);
      std::memcpy(data + r * row_bytes, b.data[r], row_bytes);
    }
    std::byte* end = data + b.rows() * row_bytes;
    std::memset(end, 0, std::size_t(start + layout.send_bytes[d] - end));
  }
}

ReceivedRows::Source parse_row_message(const std::byte* start, std::size_t bytes, int hidden, int s) {
  ReceivedRows::Source src;
  if (bytes == 0) return src;  // an empty message: no rows
  MOED_CHECK(bytes >= 2 * sizeof(std::uint32_t), "row message from rank {} has {} bytes", s, bytes);
  std::uint32_t header[2];
  std::memcpy(header, start, sizeof header);
  src.rows = header[0];
  src.pairs = header[1];
  MOED_CHECK(bytes == row_message_bytes(src.rows, src.pairs, hidden),
             "row message from rank {}: {} bytes for {} rows and {} pairs", s, bytes, src.rows, src.pairs);
  // Fields are naturally aligned: messages start 16-byte aligned, the u64s at offset 8.
  src.token = reinterpret_cast<const std::uint64_t*>(start + 2 * sizeof(std::uint32_t));
  src.pairs_per_row = reinterpret_cast<const std::uint32_t*>(src.token + src.rows);
  src.experts = src.pairs_per_row + src.rows;
  src.weights = reinterpret_cast<const float*>(src.experts + src.pairs);
  src.dests = reinterpret_cast<const std::uint32_t*>(src.weights + src.pairs);
  src.data = reinterpret_cast<const float*>(start + row_header_bytes(src.rows, src.pairs));
  src.first_pair.resize(src.rows);
  std::uint32_t next = 0;
  for (std::uint32_t r = 0; r < src.rows; ++r) {
    src.first_pair[r] = next;
    MOED_CHECK(src.pairs_per_row[r] >= 1, "row {} from rank {} has no pair", r, s);
    next += src.pairs_per_row[r];
  }
  MOED_CHECK(next == src.pairs, "row message from rank {}: rows hold {} pairs, header says {}", s, next,
             src.pairs);
  return src;
}

ReceivedRows parse_rows(const std::byte* recv, const comm::ExchangeLayout& layout, int hidden) {
  ReceivedRows out;
  out.from.resize(layout.recv_bytes.size());
  for (std::size_t s = 0; s < layout.recv_bytes.size(); ++s) {
    out.from[s] = parse_row_message(recv + layout.recv_offsets[s], layout.recv_bytes[s], hidden, int(s));
  }
  return out;
}

ReceivedRows::Source view_rows(const RowBatch& b) {
  ReceivedRows::Source src;
  src.rows = std::uint32_t(b.rows());
  src.pairs = std::uint32_t(b.experts.size());
  src.token = b.token.data();
  src.own_pairs.resize(b.rows());
  src.first_pair.resize(b.rows());
  for (std::size_t r = 0; r < b.rows(); ++r) {
    src.own_pairs[r] = b.pairs_of(r);
    src.first_pair[r] = b.pair_offsets[r];
  }
  src.pairs_per_row = src.own_pairs.data();
  src.experts = b.experts.data();
  src.weights = b.weights.data();
  src.dests = b.dests.data();
  src.row_data = b.data.data();
  return src;
}

std::vector<std::size_t> combine_message_bytes(const ReceivedRows& received, AnswerFormat f) {
  std::vector<std::size_t> bytes(received.from.size(), 0);
  for (std::size_t s = 0; s < received.from.size(); ++s)
    for (std::uint32_t r = 0; r < received.from[s].rows; ++r)
      bytes[s] += combine_row_bytes(received.from[s].pairs_per_row[r], f);
  return bytes;
}

std::vector<std::size_t> combine_message_bytes(const std::vector<RowBatch>& sent, AnswerFormat f) {
  std::vector<std::size_t> bytes(sent.size(), 0);
  for (std::size_t d = 0; d < sent.size(); ++d)
    for (std::size_t r = 0; r < sent[d].rows(); ++r) bytes[d] += combine_row_bytes(sent[d].pairs_of(r), f);
  return bytes;
}

void lay_out_answers(std::byte* block, const std::uint32_t* pairs_per_row, std::size_t rows, AnswerFormat f) {
  const std::uint32_t full_width = 8;
  for (std::size_t r = 0; r < rows; ++r) {
    const std::size_t bytes = combine_row_bytes(pairs_per_row[r], f);
    std::memset(block, 0, bytes);
    if (!f.fp32(pairs_per_row[r])) std::memcpy(block, &full_width, sizeof full_width);
    block += bytes;
  }
}

std::size_t narrow_answers(std::byte* block, const std::uint32_t* pairs_per_row, std::size_t rows, AnswerFormat f) {
  std::size_t in = 0, out = 0;  // rows only move towards the front
  for (std::size_t r = 0; r < rows; ++r) {
    const std::size_t full = combine_row_bytes(pairs_per_row[r], f);
    if (f.fp32(pairs_per_row[r])) {
      if (out != in) std::memmove(block + out, block + in, full);
      out += full;
    } else {
      const std::int64_t* sums = fixed_row_sums(block + in);
      const std::uint32_t width = std::uint32_t(kernels::fixed_width_bytes(sums, std::size_t(f.hidden)));
      const std::uint32_t header[2] = {width, 0};
      std::memcpy(block + out, header, sizeof header);
      kernels::narrow_fixed(block + in + kFixedRowHeaderBytes, std::size_t(f.hidden), int(width),
                            block + out + kFixedRowHeaderBytes);
      const std::size_t narrowed = fixed_row_bytes(f.hidden, int(width));
      std::memset(block + out + kFixedRowHeaderBytes + std::size_t(f.hidden) * width, 0,
                  narrowed - kFixedRowHeaderBytes - std::size_t(f.hidden) * width);  // padding
      out += narrowed;
    }
    in += full;
  }
  return out;
}

GatewayAnswers prepare_gateway_answers(const ReceivedRows& hop1, AnswerFormat f) {
  GatewayAnswers g;
  g.layout.send_bytes = combine_message_bytes(hop1, f);
  g.layout.send_offsets = comm::ExchangeLayout::prefix_offsets(g.layout.send_bytes);
  g.send.resize(g.layout.send_total());
  g.first_slot.push_back(0);
  for (std::size_t s = 0; s < hop1.from.size(); ++s) {
    const ReceivedRows::Source& from = hop1.from[s];
    lay_out_answers(g.send.data() + g.layout.send_offsets[s], from.pairs_per_row, from.rows, f);  // sums start at 0
    std::size_t at = g.layout.send_offsets[s];
    for (std::uint32_t r = 0; r < from.rows; ++r) {
      const std::uint32_t pairs = from.pairs_per_row[r];
      g.slot_offset.push_back(at);
      g.slot_pairs.push_back(pairs);
      at += combine_row_bytes(pairs, f);
    }
    g.first_slot.push_back(g.slot_pairs.size());
  }
  return g;
}

void narrow_gateway_answers(GatewayAnswers& g, AnswerFormat f) {
  for (std::size_t s = 0; s + 1 < g.first_slot.size(); ++s)
    g.layout.send_bytes[s] = narrow_answers(g.send.data() + g.layout.send_offsets[s], g.slot_pairs.data() + g.first_slot[s],
                                            g.first_slot[s + 1] - g.first_slot[s], f);
}

namespace {

// One answer row as it arrived: fp32 outputs, or narrow sums of `width` bytes.
struct AnswerRow {
  const std::byte* data = nullptr;
  int width = 0;  // 0: fp32
  std::size_t bytes = 0;
};

AnswerRow read_answer_row(const std::byte* block, std::size_t bytes, std::size_t at, std::uint32_t pairs,
                          AnswerFormat f, int from, std::size_t r) {
  AnswerRow row;
  if (f.fp32(pairs)) {
    row.data = block + at;
    row.bytes = combine_row_bytes(pairs, f);
  } else {
    std::uint32_t header[2] = {0, 0};
    if (at + sizeof header <= bytes) std::memcpy(header, block + at, sizeof header);
    MOED_CHECK(at + sizeof header <= bytes && header[0] >= 1 && header[0] <= 8 && header[1] == 0,
               "answers from rank {}: row {} (a sum of {} pairs at byte {} of {}) has no valid header "
               "(bytes per element {}, reserved {})",
               from, r, pairs, at, bytes, header[0], header[1]);
    row.data = block + at + kFixedRowHeaderBytes;
    row.width = int(header[0]);
    row.bytes = fixed_row_bytes(f.hidden, row.width);
  }
  MOED_CHECK(at + row.bytes <= bytes, "answers from rank {}: row {} ends at byte {}, past the message's {}", from, r,
             at + row.bytes, bytes);
  return row;
}

}  // namespace

std::size_t accumulate_answer_block(const RowBatch& b, const std::byte* block, std::size_t bytes, AnswerFormat f,
                                    std::int64_t* acc, GatewayAnswers* gateway, int from) {
  const int hidden = f.hidden;
  std::size_t saturated = 0, at = 0;
  for (std::size_t r = 0; r < b.rows(); ++r) {
    const AnswerRow row = read_answer_row(block, bytes, at, b.pairs_of(r), f, from, r);
    const float* y = reinterpret_cast<const float*>(row.data);
    const float weight = b.weights[b.pair_offsets[r]];
    std::int64_t* sums = nullptr;  // where the row adds up
    if (b.origin[r] >= 0) {
      sums = acc + std::size_t(b.origin[r]) * hidden;
    } else {
      MOED_CHECK(gateway, "an answer for a gateway slot on a rank that forwarded nothing");
      const std::size_t slot = std::size_t(-(b.origin[r] + 1));
      std::byte* out = gateway->send.data() + gateway->slot_offset.at(slot);
      if (f.fp32(gateway->slot_pairs[slot])) {  // the hop-1 row had this one pair: pass y on
        std::memcpy(out, y, std::size_t(hidden) * sizeof(float));
        at += row.bytes;
        continue;
      }
      sums = fixed_row_sums(out);
    }
    if (row.width == 0)  // one expert's output: weighted here, as the expert rank would have
      saturated += kernels::add_weighted_fixed(sums, y, weight, hidden);
    else
      kernels::add_narrow_fixed(sums, row.data, row.width, hidden);
    at += row.bytes;
  }
  MOED_CHECK(at == bytes, "answers from rank {}: {} bytes, its rows take {}", from, bytes, at);
  return saturated;
}

void answer_row_bytes(const RowBatch& sent, const std::byte* block, std::size_t bytes, AnswerFormat f, int from,
                      std::vector<std::uint32_t>& row_bytes) {
  row_bytes.clear();
  for (std::size_t r = 0, at = 0; r < sent.rows(); ++r) {
    const AnswerRow row = read_answer_row(block, bytes, at, sent.pairs_of(r), f, from, r);
    row_bytes.push_back(std::uint32_t(row.bytes));
    at += row.bytes;
  }
}

std::size_t accumulate_answers(const std::vector<RowBatch>& sent, const std::byte* recv,
                               const comm::ExchangeLayout& layout, AnswerFormat f, std::int64_t* acc,
                               GatewayAnswers* gateway) {
  std::size_t saturated = 0;
  for (std::size_t d = 0; d < sent.size(); ++d)
    saturated += accumulate_answer_block(sent[d], recv + layout.recv_offsets[d], layout.recv_bytes[d], f, acc,
                                         gateway, int(d));
  return saturated;
}

}  // namespace moed::runtime
