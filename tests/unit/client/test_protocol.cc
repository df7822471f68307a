// The front door's wire format: every message round-trips, frames are cut
// right from any split of the stream, and every malformed input is refused
// with a reason instead of being misread.
#include "client/protocol.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>

namespace moed::wire {
namespace {

Frame one_frame(const std::vector<std::byte>& bytes) {
  FrameReader r;
  r.feed(bytes);
  std::string error;
  auto f = r.next(error);
  EXPECT_TRUE(f) << error;
  EXPECT_EQ(r.buffered(), 0u);
  return f.value_or(Frame{});
}

TEST(WireProtocol, MessagesRoundTrip) {
  std::string error;
  auto hello = decode_hello(one_frame(encode(Hello{3, 200})).payload, error);
  ASSERT_TRUE(hello) << error;
  EXPECT_EQ(hello->slots, 3u);
  EXPECT_EQ(hello->max_rows, 200u);

  Welcome w{2, 4, 32, make_layout(4096, 128, 4)};
  const Frame wf = one_frame(encode(w));
  EXPECT_EQ(wf.type, Type::welcome);
  auto welcome = decode_welcome(wf.payload, error);
  ASSERT_TRUE(welcome) << error;
  EXPECT_EQ(welcome->rank, 2u);
  EXPECT_EQ(welcome->ranks, 4u);
  EXPECT_EQ(welcome->layers, 32u);
  EXPECT_EQ(welcome->layout.slot_bytes, w.layout.slot_bytes);

  auto submit = decode_submit(one_frame(encode(Submit{99, 1, 7, 12, DType::bf16})).payload, error);
  ASSERT_TRUE(submit) << error;
  EXPECT_EQ(submit->tag, 99u);
  EXPECT_EQ(submit->slot, 1u);
  EXPECT_EQ(submit->layer, 7u);
  EXPECT_EQ(submit->rows, 12u);
  EXPECT_EQ(submit->dtype, DType::bf16);

  auto done = decode_done(one_frame(encode(Done{5, 2, 12})).payload, error);
  ASSERT_TRUE(done) << error;
  EXPECT_EQ(done->tag, 5u);
  EXPECT_EQ(done->rows, 12u);

  auto reply = decode_error(one_frame(encode(ErrorReply{6, 0, Status::not_finite, "row 3 holds NaN"})).payload, error);
  ASSERT_TRUE(reply) << error;
  EXPECT_EQ(reply->status, Status::not_finite);
  EXPECT_EQ(reply->message, "row 3 holds NaN");
}

TEST(WireProtocol, FramesAreCutFromAnySplitOfTheStream) {
  std::vector<std::byte> stream;
  for (std::uint64_t tag = 1; tag <= 3; ++tag) {
    auto f = encode(Submit{tag, 0, 1, 2, DType::f32});
    stream.insert(stream.end(), f.begin(), f.end());
  }
  for (std::size_t chunk : {1, 5, 16, 17, 1000}) {
    FrameReader r;
    std::vector<std::uint64_t> tags;
    std::string error;
    for (std::size_t at = 0; at < stream.size(); at += chunk) {
      r.feed({stream.data() + at, std::min(chunk, stream.size() - at)});
      while (auto f = r.next(error)) tags.push_back(decode_submit(f->payload, error)->tag);
      ASSERT_TRUE(error.empty()) << error;
    }
    EXPECT_EQ(tags, (std::vector<std::uint64_t>{1, 2, 3})) << "chunks of " << chunk;
  }
}

struct BadHeader {
  const char* name;
  std::size_t offset;
  std::uint32_t value;
  std::size_t width;
  const char* words;
};

class BrokenStreams : public ::testing::TestWithParam<BadHeader> {};

TEST_P(BrokenStreams, AreRefusedWithAReason) {
  auto frame = encode(Submit{1, 0, 0, 1, DType::f32});
  std::memcpy(frame.data() + GetParam().offset, &GetParam().value, GetParam().width);
  FrameReader r;
  r.feed(frame);
  std::string error;
  EXPECT_FALSE(r.next(error));
  EXPECT_NE(error.find(GetParam().words), std::string::npos) << error;
}

INSTANTIATE_TEST_SUITE_P(
    Headers, BrokenStreams,
    ::testing::Values(BadHeader{"magic", 0, 0x50545448, 4, "bad magic"},
                      BadHeader{"version", 4, 9, 2, "protocol version 9"},
                      BadHeader{"type", 6, 77, 2, "unknown frame type 77"},
                      BadHeader{"length", 8, 1u << 20, 4, "at most 4096"}),
    [](const auto& info) { return std::string(info.param.name); });

TEST(WireProtocol, PayloadsOfTheWrongSizeOrValueAreRefused) {
  std::string error;
  auto payload = one_frame(encode(Submit{1, 0, 0, 1, DType::f32})).payload;
  auto shorter = payload;
  shorter.pop_back();
  EXPECT_FALSE(decode_submit(shorter, error));
  EXPECT_NE(error.find("submit payload of 23 bytes, expected 24"), std::string::npos) << error;
  auto longer = payload;
  longer.push_back(std::byte{0});
  EXPECT_FALSE(decode_submit(longer, error));
  const std::uint32_t dtype = 5;
  std::memcpy(payload.data() + 20, &dtype, 4);
  EXPECT_FALSE(decode_submit(payload, error));
  EXPECT_NE(error.find("unknown dtype 5"), std::string::npos) << error;

  auto reply = one_frame(encode(ErrorReply{1, 0, Status::busy, "x"})).payload;
  const std::uint32_t huge = 1000;
  auto lying = reply;
  std::memcpy(lying.data() + 16, &huge, 4);  // text longer than the payload
  EXPECT_FALSE(decode_error(lying, error));
  const std::uint32_t status = 99;
  std::memcpy(reply.data() + 12, &status, 4);
  EXPECT_FALSE(decode_error(reply, error));
  EXPECT_NE(error.find("unknown status 99"), std::string::npos) << error;

  auto welcome = one_frame(encode(Welcome{0, 1, 2, make_layout(64, 8, 2)})).payload;
  welcome[40] = std::byte{1};  // rows_offset no longer the one the layout gives
  EXPECT_FALSE(decode_welcome(welcome, error));
  EXPECT_NE(error.find("layout"), std::string::npos) << error;
}

TEST(WireProtocol, LongMessagesAreCutToFitAFrame) {
  const std::string text(10000, 'x');
  const Frame f = one_frame(encode(ErrorReply{1, 0, Status::internal, text}));
  std::string error;
  auto reply = decode_error(f.payload, error);
  ASSERT_TRUE(reply) << error;
  EXPECT_EQ(reply->message.size(), kMaxPayload - 20);
}

TEST(WireProtocol, TheLayoutIsAlignedAndHoldsEverything) {
  for (auto [hidden, rows] : {std::pair<std::uint32_t, std::uint32_t>{4096, 128}, {64, 1}, {7, 33}}) {
    const Layout l = make_layout(hidden, rows, 3);
    EXPECT_EQ(l.ids_offset % 64, 0u);
    EXPECT_EQ(l.positions_offset % 64, 0u);
    EXPECT_EQ(l.rows_offset % 64, 0u);
    EXPECT_GE(l.positions_offset, l.ids_offset + 8u * rows);
    EXPECT_GE(l.rows_offset, l.positions_offset + 4u * rows);
    EXPECT_GE(l.slot_bytes, l.rows_offset + 4ull * rows * hidden);
    EXPECT_EQ(l.slot_bytes % 4096, 0u);
    EXPECT_EQ(l.region_bytes(), 3 * l.slot_bytes);
  }
}

TEST(Bf16, WideningIsExactAndNarrowingRoundsToNearestEven) {
  for (float v : {0.0f, -0.0f, 1.0f, -2.5f, 3.140625f, 0x1.5p100f, std::numeric_limits<float>::infinity()})
    EXPECT_EQ(bf16_to_float(float_to_bf16(v)), v) << v;  // representable: unchanged
  // 1 + 2^-8 lies halfway between 1 and 1 + 2^-7: ties to even (1).
  EXPECT_EQ(bf16_to_float(float_to_bf16(1.0f + 0x1p-8f)), 1.0f);
  // 1 + 3 x 2^-8 lies halfway between 1 + 2^-7 and 1 + 2^-6: ties to even (1 + 2^-6).
  EXPECT_EQ(bf16_to_float(float_to_bf16(1.0f + 3 * 0x1p-8f)), 1.0f + 0x1p-6f);
  EXPECT_EQ(bf16_to_float(float_to_bf16(1.0f + 0x1p-8f + 0x1p-20f)), 1.0f + 0x1p-7f);
  EXPECT_TRUE(std::isnan(bf16_to_float(float_to_bf16(std::nanf("")))));
}

}  // namespace
}  // namespace moed::wire
