// The wire formats of a layer (runtime/engine/wire_format.h): row messages
// packed and parsed back bit for bit (alignment and padding included) and
// refused when malformed; answer rows (fp32 or fixed point, full width or
// narrowed row by row to the same integers), their sizes on both sides,
// their sums at the home, and a bad header or a row past its message
// refused.
#include "runtime/engine/wire_format.h"

#include <gtest/gtest.h>

#include <bit>
#include <cstdint>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "common/error.h"
#include "common/rng.h"
#include "kernels/cpu/fixed_combine.h"
#include "placement/placement.h"
#include "placement/topology.h"
#include "runtime/engine/dispatch_plan.h"
#include "runtime/router/router.h"
#include "tests/unit/runtime/engine/plan_test_support.h"
#include "tests/unit/test_support.h"

namespace moed::runtime {
namespace {

using placement::Placement;
using placement::Topology;
using test::expect_error;

// ---------------------------------------------------------------- row wire format

struct MessageSize {
  std::size_t rows, pairs;
  int hidden;
  std::size_t bytes;
};

class RowMessageBytes : public ::testing::TestWithParam<MessageSize> {};

TEST_P(RowMessageBytes, HeaderAndDataEachPaddedTo16) {
  const auto& m = GetParam();
  EXPECT_EQ(row_message_bytes(m.rows, m.pairs, m.hidden), m.bytes);
  EXPECT_EQ(m.bytes % 16, 0u);
}

// Header: 8 + 12 per row (u64 token, u32 pairs) + 12 per pair (expert, weight, dest).
INSTANTIATE_TEST_SUITE_P(
    Sizes, RowMessageBytes,
    ::testing::Values(MessageSize{0, 0, 5, 16},    // 8 -> 16, no data
                      MessageSize{2, 3, 5, 128},   // 8 + 24 + 36 = 68 -> 80; 40 -> 48
                      MessageSize{1, 1, 4, 48},    // 8 + 12 + 12 = 32; 16
                      MessageSize{3, 3, 1, 96},    // 8 + 36 + 36 = 80; 12 -> 16
                      MessageSize{1, 2, 8, 80}));  // 8 + 12 + 24 = 44 -> 48; 32

// Token rows with awkward bits: signed zeros, a denormal, NaN and infinity payloads.
std::vector<float> odd_rows(std::size_t tokens, int hidden, std::uint64_t seed) {
  CounterRng rng(seed);
  std::vector<float> x(tokens * hidden);
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = std::bit_cast<float>(std::uint32_t(rng.bits(i)));
  x[0] = -0.0f;
  if (x.size() > 2) x[1] = 0x1p-140f, x[2] = std::bit_cast<float>(0x7fc01234u);
  return x;
}

// Packs `batches`, reads them back as if each message had come from the rank it
// was sent to, and checks every field bit for bit, the layout, alignment and padding.
void expect_round_trip(const std::vector<RowBatch>& batches, int H) {
  std::vector<std::byte> buffer(4096, std::byte{0xCD});  // stale bytes that padding must clear
  comm::ExchangeLayout layout;
  pack_rows(batches, H, buffer, layout);
  const std::size_t R = batches.size();
  std::vector<std::size_t> bytes, offsets;
  std::size_t total = 0;
  for (const RowBatch& b : batches) {
    offsets.push_back(total);
    bytes.push_back(b.rows() ? row_message_bytes(b.rows(), b.experts.size(), H) : 0);  // empty: no message
    total += bytes.back();
  }
  EXPECT_EQ(layout.send_bytes, bytes);
  EXPECT_EQ(layout.send_offsets, offsets);
  EXPECT_EQ(buffer.size(), total);

  layout.recv_bytes = layout.send_bytes;
  layout.recv_offsets = layout.send_offsets;
  const ReceivedRows received = parse_rows(buffer.data(), layout, H);
  ASSERT_EQ(received.from.size(), R);
  for (std::size_t d = 0; d < R; ++d) {
    SCOPED_TRACE("message to rank " + std::to_string(d));
    const auto& src = received.from[d];
    const RowBatch& b = batches[d];
    ASSERT_EQ(src.rows, b.rows());
    ASSERT_EQ(src.pairs, b.experts.size());
    for (std::uint32_t row = 0; row < src.rows; ++row) {
      EXPECT_EQ(src.token[row], b.token[row]);
      EXPECT_EQ(src.pairs_per_row[row], b.pairs_of(row));
      EXPECT_EQ(src.first_pair[row], b.pair_offsets[row]);
      EXPECT_EQ(std::memcmp(src.data + std::size_t(row) * H, b.data[row], H * sizeof(float)), 0)
          << "row " << row;
    }
    for (std::uint32_t i = 0; i < src.pairs; ++i) {
      EXPECT_EQ(src.experts[i], b.experts[i]);
      EXPECT_EQ(std::bit_cast<std::uint32_t>(src.weights[i]), std::bit_cast<std::uint32_t>(b.weights[i]));
      EXPECT_EQ(src.dests[i], b.dests[i]);
    }
    if (src.rows == 0) continue;
    // Every message starts 16-byte aligned in the buffer, the u64 token ids at offset 8.
    const std::byte* start = buffer.data() + layout.send_offsets[d];
    EXPECT_EQ(layout.send_offsets[d] % 16, 0u);
    EXPECT_EQ(reinterpret_cast<const std::byte*>(src.token) - start, 8);
    EXPECT_EQ(reinterpret_cast<std::uintptr_t>(src.token) % alignof(std::uint64_t), 0u);
    // The header ends after the dests; zero padding up to the data, at a multiple of 16.
    const std::size_t meta = 8 + 12 * std::size_t(src.rows) + 12 * std::size_t(src.pairs);
    EXPECT_EQ(reinterpret_cast<const std::byte*>(src.dests + src.pairs) - start, std::ptrdiff_t(meta));
    const std::size_t data_at = std::size_t(reinterpret_cast<const std::byte*>(src.data) - start);
    EXPECT_EQ(data_at, (meta + 15) / 16 * 16);
    for (std::size_t i = meta; i < data_at; ++i)
      EXPECT_EQ(start[i], std::byte{0}) << "header padding byte " << i;
    for (std::size_t i = data_at + std::size_t(src.rows) * H * 4; i < layout.send_bytes[d]; ++i)
      EXPECT_EQ(start[i], std::byte{0}) << "data padding byte " << i;
  }
}

TEST(RowWire, PackThenParseGivesTheHop2PlanBack) {
  const int H = 5;
  const Placement p = placement::contiguous(3, 1, 6);  // experts 0-1, 2-3, 4-5
  const Routing r = make_routing({{{0, .6f}, {1, .4f}},
                                  {{2, .7f}, {0, .3f}},
                                  {{3, .55f}, {2, .45f}},
                                  {{1, .9f}, {3, .1f}}});
  const ExpertCounts c = counts_of({ExpertCounts::local(r, 6), std::vector<std::uint32_t>(6, 0),
                                    std::vector<std::uint32_t>(6, 0)});
  PlanInput in = plan_input(r, p, c, 0);
  in.first_token = (std::uint64_t(1) << 40) + 3;  // token ids need all 64 bits
  const std::vector<float> x = odd_rows(4, H, 3);
  const DispatchPlan plan = plan_dispatch(in, x.data(), H);
  // rank 0: 3 rows, 4 pairs; rank 1: 3 rows, 4 pairs; rank 2: none (an empty 16-byte message).
  ASSERT_EQ(plan.hop2[0].rows(), 3u);
  ASSERT_EQ(plan.hop2[1].experts.size(), 4u);
  ASSERT_EQ(plan.hop2[2].rows(), 0u);
  expect_round_trip(plan.hop2, H);
}

TEST(RowWire, PackThenParseGivesTheHop1PlanBack) {
  // The hop-1 message carries the dests of remote pairs: token 0's pairs go to ranks 2 and 3.
  const int H = 3;
  Placement p(4, 1, 4);
  for (int e = 0; e < 4; ++e) p.set_replicas(0, e, {e});
  const Routing r = make_routing({{{2, .5f}, {3, .5f}}, {{3, 1}}, {{0, 1}}});
  const ExpertCounts c = counts_of({{0, 0, 0, 0}, {0, 0, 0, 0}, {0, 0, 0, 0}, {0, 0, 0, 0}});
  const Topology t = Topology::blocks(4, 2);
  PlanInput in = plan_input(r, p, c, 0);
  in.topology = &t;
  in.hierarchical = true;
  in.first_token = ~std::uint64_t(0) - 10;
  const std::vector<float> x = odd_rows(3, H, 8);
  const DispatchPlan plan = plan_dispatch(in, x.data(), H);
  ASSERT_EQ(plan.hop1[2].dests, (std::vector<std::uint32_t>{2, 3, 3}));
  expect_round_trip(plan.hop1, H);
}

class RowWireErrors : public ::testing::Test {
 protected:
  void SetUp() override {
    const Placement p = placement::contiguous(1, 1, 2);
    r = make_routing({{{0, .5f}, {1, .5f}}, {{1, 1}}});
    c = counts_of({ExpertCounts::local(r, 2)});
    x.assign(2 * H, 1.0f);
    plan = plan_dispatch(plan_input(r, p, c, 0), x.data(), H);
    pack_rows(plan.hop2, H, buffer, layout);
    layout.recv_bytes = layout.send_bytes;
    layout.recv_offsets = layout.send_offsets;
  }
  // Words: rows, pairs, token ids (2 words each), pairs per row, experts, weights, dests.
  std::uint32_t* words() { return reinterpret_cast<std::uint32_t*>(buffer.data()); }

  static constexpr int H = 4;
  Routing r;
  ExpertCounts c;
  DispatchPlan plan;
  std::vector<float> x;
  std::vector<std::byte> buffer;
  comm::ExchangeLayout layout;
};

TEST_F(RowWireErrors, SizeThatDisagreesWithTheHeader) {
  ASSERT_EQ(words()[0], 2u);  // rows
  ASSERT_EQ(words()[1], 3u);  // pairs
  layout.recv_bytes[0] -= 16;
  expect_error([&] { parse_rows(buffer.data(), layout, H); }, ErrorKind::Internal, {"rank 0", "bytes"});
}

TEST_F(RowWireErrors, TooShortForAHeader) {
  layout.recv_bytes[0] = 4;
  expect_error([&] { parse_rows(buffer.data(), layout, H); }, ErrorKind::Internal, {"rank 0", "4 bytes"});
}

TEST_F(RowWireErrors, PairsPerRowThatDisagreeWithTheHeader) {
  ASSERT_EQ(words()[6], 2u);  // after 2 words of header and 2 u64 token ids
  words()[6] = 1;             // rows now hold 2 pairs, the header says 3
  expect_error([&] { parse_rows(buffer.data(), layout, H); }, ErrorKind::Internal,
               {"rank 0", "2 pairs", "3"});
}

TEST_F(RowWireErrors, RowWithoutPairs) {
  ASSERT_EQ(words()[7], 1u);
  words()[7] = 0;
  expect_error([&] { parse_rows(buffer.data(), layout, H); }, ErrorKind::Internal, {"row 1", "no pair"});
}

TEST_F(RowWireErrors, PackRefusesARowWithoutData) {
  plan.hop2[0].data[1] = nullptr;
  expect_error([&] { pack_rows(plan.hop2, H, buffer, layout); }, ErrorKind::Internal,
               {"row 1", "rank 0", "no data"});
}

// ---------------------------------------------------------------- combine wire format

struct RowBytes {
  std::uint32_t pairs;
  int hidden;
  std::size_t bytes;
};

class CombineRowBytes : public ::testing::TestWithParam<RowBytes> {};

TEST_P(CombineRowBytes, Fp32PaddedTo8ForOnePairHeaderAndFullWidthSumsForMore) {
  EXPECT_EQ(combine_row_bytes(GetParam().pairs, AnswerFormat(GetParam().hidden)), GetParam().bytes);
}

INSTANTIATE_TEST_SUITE_P(Sizes, CombineRowBytes,
                         ::testing::Values(RowBytes{1, 5, 24}, RowBytes{1, 4, 16}, RowBytes{1, 1, 8},
                                           RowBytes{2, 5, 48}, RowBytes{3, 4, 40}, RowBytes{2, 1, 16},
                                           RowBytes{8, 3, 32}));

struct NarrowRowBytes {
  int hidden, width;
  std::size_t bytes;
};

class FixedRowBytes : public ::testing::TestWithParam<NarrowRowBytes> {};

TEST_P(FixedRowBytes, HeaderThenWidthBytesPerSumPaddedTo8) {
  EXPECT_EQ(fixed_row_bytes(GetParam().hidden, GetParam().width), GetParam().bytes);
}

INSTANTIATE_TEST_SUITE_P(Sizes, FixedRowBytes,
                         ::testing::Values(NarrowRowBytes{3, 1, 16}, NarrowRowBytes{8, 1, 16},
                                           NarrowRowBytes{9, 1, 24}, NarrowRowBytes{3, 5, 24},
                                           NarrowRowBytes{2048, 5, 8 + 10240}, NarrowRowBytes{3, 8, 32},
                                           NarrowRowBytes{0, 4, 8}));

// Home rank 0 of two ranks: two rows went to rank 1, global token 20 (local 0) with one
// pair (expert 2, weight 0.25), token 21 (local 1) with two pairs.
std::vector<RowBatch> hand_sent() {
  static const float row[3] = {0, 0, 0};
  std::vector<RowBatch> sent(2);
  sent[1].add(20, 0, row, 2, 0.25f, 1);
  sent[1].add(21, 1, row, 3, 0.5f, 1);
  sent[1].add(21, 1, row, 1, 0.5f, 1);
  return sent;
}

TEST(CombineWire, MessageBytesByPairCountOnBothSides) {
  const int H = 3;
  // An fp32 row (12 bytes, padded to 16) and a fixed-point row at full width (8 + 24).
  EXPECT_EQ(combine_message_bytes(hand_sent(), AnswerFormat(H)), (std::vector<std::size_t>{0, 16 + 32}));
  Received at;  // the same rows as rank 1 received them (here indexed by destination)
  receive(hand_sent(), H, at);
  EXPECT_EQ(combine_message_bytes(at.rows, AnswerFormat(H)), (std::vector<std::size_t>{0, 16 + 32}));
}

// The answers from rank 1 at full width: an fp32 row (3 floats + 4 bytes padding), then a
// fixed-point row (header: 8 bytes per sum; then the sums).
std::vector<std::byte> hand_answers(const float y[3], const std::int64_t partial[3]) {
  std::vector<std::byte> buf(48, std::byte{0xFF});  // padding bytes are garbage on purpose
  const std::uint32_t header[2] = {8, 0};
  std::memcpy(buf.data(), y, 12);
  std::memcpy(buf.data() + 16, header, 8);
  std::memcpy(buf.data() + 24, partial, 24);
  return buf;
}

comm::ExchangeLayout answers_from_rank1(std::size_t bytes) {
  comm::ExchangeLayout layout;
  layout.recv_bytes = {0, bytes};
  layout.recv_offsets = {0, 0};
  return layout;
}

TEST(CombineWire, AccumulateAnswersWeightsAtHomeAndAddsPartials) {
  const int H = 3;
  const float y[3] = {1.0f, -2.0f, 0x1.8p-31f};
  const std::int64_t partial[3] = {5, -7, std::int64_t(1) << 40};
  const std::vector<std::byte> recv = hand_answers(y, partial);
  std::vector<std::int64_t> acc = {1, 2, 3, 4, 5, 6};
  EXPECT_EQ(accumulate_answers(hand_sent(), recv.data(), answers_from_rank1(48), AnswerFormat(H), acc.data(), nullptr), 0u);
  // Local token 0: 0.25 * y * 2^32 = {2^30, -2^31, 0.75 -> rounds to 1}, added to {1, 2, 3}.
  EXPECT_EQ(acc[0], 1 + (std::int64_t(1) << 30));
  EXPECT_EQ(acc[1], 2 - (std::int64_t(1) << 31));
  EXPECT_EQ(acc[2], 3 + 1);
  // Local token 1: the partial as it came.
  EXPECT_EQ(acc[3], 4 + 5);
  EXPECT_EQ(acc[4], 5 - 7);
  EXPECT_EQ(acc[5], 6 + (std::int64_t(1) << 40));
}

TEST(CombineWire, AccumulateAnswersCountsSaturatedTerms) {
  const int H = 3;
  // 0.25 * 4e10 * 2^32 = 4.3e19 > 2^62: saturates at +-2^62.
  const float y[3] = {4e10f, -4e10f, 1.0f};
  const std::int64_t partial[3] = {0, 0, 0};
  const std::vector<std::byte> recv = hand_answers(y, partial);
  std::vector<std::int64_t> acc(6, 0);
  EXPECT_EQ(accumulate_answers(hand_sent(), recv.data(), answers_from_rank1(48), AnswerFormat(H), acc.data(), nullptr), 2u);
  EXPECT_EQ(acc[0], std::int64_t(1) << 62);
  EXPECT_EQ(acc[1], -(std::int64_t(1) << 62));
  EXPECT_EQ(acc[2], std::int64_t(1) << 30);
}

TEST(CombineWire, AccumulateAnswersRefusesAWrongSize) {
  const int H = 3;
  const float y[3] = {0, 0, 0};
  const std::int64_t partial[3] = {0, 0, 0};
  std::vector<std::byte> recv = hand_answers(y, partial);
  recv.resize(64);
  std::vector<std::int64_t> acc(6, 0);
  expect_error(
      [&] { accumulate_answers(hand_sent(), recv.data(), answers_from_rank1(56), AnswerFormat(H), acc.data(), nullptr); },
      ErrorKind::Internal, {"rank 1", "56 bytes", "rows take 48"});
}

// Narrowed in place: the fp32 row stays, the sums {5, -7, 100} fit in one byte each
// (header + 3 bytes padded to 8), and the home adds the same integers.
TEST(CombineWire, NarrowedAnswersAddTheSameIntegers) {
  const int H = 3;
  const float y[3] = {1.0f, -2.0f, 0.5f};
  const std::int64_t partial[3] = {5, -7, 100};
  std::vector<std::byte> full = hand_answers(y, partial), narrow = full;
  const std::uint32_t pairs[2] = {1, 2};
  ASSERT_EQ(narrow_answers(narrow.data(), pairs, 2, AnswerFormat(H)), 16u + 16u);
  std::uint32_t header[2];
  std::memcpy(header, narrow.data() + 16, sizeof header);
  EXPECT_EQ(header[0], 1u);
  EXPECT_EQ(header[1], 0u);
  EXPECT_EQ(std::memcmp(narrow.data(), y, 12), 0);
  const std::int8_t bytes[8] = {5, -7, 100, 0, 0, 0, 0, 0};  // padding zeroed
  EXPECT_EQ(std::memcmp(narrow.data() + 24, bytes, 8), 0);
  std::vector<std::int64_t> from_full = {1, 2, 3, 4, 5, 6}, from_narrow = from_full;
  accumulate_answers(hand_sent(), full.data(), answers_from_rank1(48), AnswerFormat(H), from_full.data(), nullptr);
  accumulate_answers(hand_sent(), narrow.data(), answers_from_rank1(32), AnswerFormat(H), from_narrow.data(), nullptr);
  EXPECT_EQ(from_narrow, from_full);
  EXPECT_EQ(from_narrow[3], 4 + 5);
  EXPECT_EQ(from_narrow[4], 5 - 7);
}

// Each row narrows to its own width; rows move to the front of the message.
TEST(CombineWire, EachRowNarrowsToItsOwnWidth) {
  const int H = 2;
  // Rows at full width: fixed {1, -1} (24 bytes, narrowed 16: 1 byte per sum), fp32 (8),
  // fixed {2^40, -3} (24, narrowed 24: 6 bytes), fixed {kFixedNaN, 0} (24, still 24: 8 bytes).
  const std::uint32_t pairs[4] = {2, 1, 3, 2};
  std::vector<std::byte> message(24 + 8 + 24 + 24);
  lay_out_answers(message.data(), pairs, 4, AnswerFormat(H));
  std::byte* row = message.data();
  const std::int64_t sums[3][2] = {{1, -1}, {std::int64_t(1) << 40, -3}, {kernels::kFixedNaN, 0}};
  const float y[2] = {0.25f, -8.0f};
  std::memcpy(fixed_row_sums(row), sums[0], 16);
  std::memcpy(row + 24, y, 8);
  std::memcpy(fixed_row_sums(row + 32), sums[1], 16);
  std::memcpy(fixed_row_sums(row + 56), sums[2], 16);
  const std::size_t bytes = narrow_answers(message.data(), pairs, 4, AnswerFormat(H));
  EXPECT_EQ(bytes, std::size_t(16 + 8 + 24 + 24));
  RowBatch sent;  // the same rows as sent: local tokens 0-3
  const float data[2] = {0, 0};
  sent.add(0, 0, data, 0, 1, 1);
  sent.add(0, 0, data, 1, 1, 1);
  sent.add(1, 1, data, 0, 0.5f, 1);
  for (std::uint32_t e : {0u, 1u, 2u}) sent.add(2, 2, data, e, 1, 1);
  sent.add(3, 3, data, 0, 1, 1);
  sent.add(3, 3, data, 1, 1, 1);
  std::vector<std::int64_t> acc(8, 10);
  EXPECT_EQ(accumulate_answer_block(sent, message.data(), bytes, AnswerFormat(H), acc.data(), nullptr, 1), 0u);
  EXPECT_EQ(acc, (std::vector<std::int64_t>{11, 9, 10 + (std::int64_t(1) << 29), 10 - (std::int64_t(1) << 34),
                                            10 + (std::int64_t(1) << 40), 7, kernels::kFixedNaN, 10}));
}

class AnswerHeaderErrors : public ::testing::TestWithParam<std::pair<std::uint32_t, std::uint32_t>> {};

// A fixed-point row whose header is not (1-8 bytes per sum, 0) is refused, naming the row.
TEST_P(AnswerHeaderErrors, AreRefusedNamingTheRow) {
  const int H = 3;
  const float y[3] = {0, 0, 0};
  const std::int64_t partial[3] = {0, 0, 0};
  std::vector<std::byte> recv = hand_answers(y, partial);
  const std::uint32_t header[2] = {GetParam().first, GetParam().second};
  std::memcpy(recv.data() + 16, header, sizeof header);
  std::vector<std::int64_t> acc(6, 0);
  expect_error(
      [&] { accumulate_answers(hand_sent(), recv.data(), answers_from_rank1(48), AnswerFormat(H), acc.data(), nullptr); },
      ErrorKind::Internal, {"rank 1", "row 1", "no valid header"});
}

INSTANTIATE_TEST_SUITE_P(Headers, AnswerHeaderErrors,
                         ::testing::Values(std::pair{0u, 0u}, std::pair{9u, 0u}, std::pair{8u, 1u},
                                           std::pair{0xFFFFFFFFu, 0u}));

TEST(CombineWire, ARowPastTheMessageIsRefused) {
  const int H = 3;
  const float y[3] = {0, 0, 0};
  const std::int64_t partial[3] = {0, 0, 0};
  const std::vector<std::byte> recv = hand_answers(y, partial);
  std::vector<std::int64_t> acc(6, 0);
  // The header says 8 bytes per sum, 32 for the row; 24 of them came.
  expect_error(
      [&] { accumulate_answers(hand_sent(), recv.data(), answers_from_rank1(40), AnswerFormat(H), acc.data(), nullptr); },
      ErrorKind::Internal, {"rank 1", "row 1", "ends at byte 48", "40"});
  // Not even the header.
  expect_error(
      [&] { accumulate_answers(hand_sent(), recv.data(), answers_from_rank1(20), AnswerFormat(H), acc.data(), nullptr); },
      ErrorKind::Internal, {"rank 1", "row 1", "no valid header"});
}

TEST(SplitExpert, AnswersAreInt64WhenExpertsHaveSeveralChunks) {
  const AnswerFormat one_chunk(8), chunks(8, false);
  EXPECT_TRUE(one_chunk.fp32(1));
  EXPECT_FALSE(chunks.fp32(1));
  EXPECT_EQ(combine_row_bytes(1, one_chunk), 32u);
  EXPECT_EQ(combine_row_bytes(1, chunks), 72u);
  EXPECT_EQ(combine_row_bytes(2, chunks), combine_row_bytes(2, one_chunk));
}

}  // namespace
}  // namespace moed::runtime
