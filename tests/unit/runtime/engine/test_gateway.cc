// A gateway's side of hierarchical dispatch (plan_forward in
// runtime/engine/dispatch_plan.h, GatewayAnswers in wire_format.h): the
// hop-2 rows it forwards inside its island, one answer slot per hop-1 row,
// its island's answers summed exactly into them (full width or narrowed),
// and the homes adding what it sends back.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <vector>

#include "common/error.h"
#include "placement/topology.h"
#include "runtime/engine/dispatch_plan.h"
#include "runtime/engine/wire_format.h"
#include "tests/unit/runtime/engine/plan_test_support.h"
#include "tests/unit/test_support.h"

namespace moed::runtime {
namespace {

using placement::Topology;
using test::expect_error;

constexpr std::int64_t kOne = std::int64_t(1) << 32;  // 1.0 in fixed point

// ---------------------------------------------------------------- at a gateway

// Islands {0, 1, 2} and {3, 4}: rank 3 is the gateway of island 1 for homes 0 and 2
// (index 0 and 2 in their island, modulo 2: index 0 of {3, 4}). Experts 5 and 8 are on
// rank 3, 6 and 7 on rank 4. Rank 3 receives the hop-1 rows
//   from home 0: token 10: (expert 5, .75, rank 3), (7, .25, rank 4)         gateway slot 0
//                token 11: (6, .5, rank 4)                                   slot 1
//   from home 2: token 30: (8, .5, rank 3), (5, .25, rank 3), (6, .25, rank 4)  slot 2
// and has one token of its own, global 40, with (5, 1, rank 3).
class AtTheGateway : public ::testing::Test {
 protected:
  static constexpr int H = 3;
  void SetUp() override {
    home0.resize(5);
    home2.resize(5);
    home0[3].add(10, 0, x0.data(), 5, .75f, 3);
    home0[3].add(10, 0, x0.data(), 7, .25f, 4);
    home0[3].add(11, 1, x0.data() + H, 6, .5f, 4);
    home2[3].add(30, 0, x2.data(), 8, .5f, 3);
    home2[3].add(30, 0, x2.data(), 5, .25f, 3);
    home2[3].add(30, 0, x2.data(), 6, .25f, 4);
    std::vector<RowBatch> at3(5);  // what rank 3 receives in hop 1, by source
    at3[0] = home0[3];
    at3[2] = home2[3];
    receive(at3, H, hop1);
    plan.hop2.resize(5);
    plan.hop2[3].add(40, 0, own.data(), 5, 1, 3);
    plan_forward(hop1.rows, H, plan);
  }

  // The island's answers to rank 3's hop-2 rows, as ExpertExecutor writes them:
  //   rank 3 (itself): token 40 fp32 y_own, token 10 fp32 y_a, token 30 fixed-point partial;
  //   rank 4:          token 10 fp32 y_b, token 11 fp32 y_c, token 30 fp32 y_d.
  // Padding bytes are garbage on purpose.
  void answer_island() {
    answers.assign(64 + 48, std::byte{0xFF});
    auto put = [&](std::size_t at, const void* p, std::size_t n) { std::memcpy(answers.data() + at, p, n); };
    const std::uint32_t full_width[2] = {8, 0};
    put(0, y_own, 12);
    put(16, y_a, 12);
    put(32, full_width, 8);  // fixed point: 2 pairs
    put(40, partial, 24);
    put(64, y_b, 12);
    put(80, y_c, 12);
    put(96, y_d, 12);
    layout.recv_bytes = {0, 0, 0, 64, 48};
    layout.recv_offsets = {0, 0, 0, 0, 64};
  }

  const Topology topology{{0, 0, 0, 1, 1}};
  const std::vector<float> x0 = token_rows(2, H), x2 = token_rows(1, H), own = token_rows(1, H);
  std::vector<RowBatch> home0, home2;  // the homes' hop 1
  Received hop1;
  DispatchPlan plan;  // rank 3's

  const float y_own[3] = {1, 2, 3};
  const float y_a[3] = {1, -2, 0.5f};
  const float y_b[3] = {4, 0.5f, -1};
  const float y_c[3] = {0x1.8p-30f, -0.0f, -3};
  const float y_d[3] = {8, -4, 0.25f};
  const std::int64_t partial[3] = {5, -7, std::int64_t(1) << 40};
  std::vector<std::byte> answers;
  comm::ExchangeLayout layout;
};

TEST_F(AtTheGateway, IsTheGatewayOfBothHomes) {
  EXPECT_EQ(gateway(topology, 0, 1), 3);
  EXPECT_EQ(gateway(topology, 2, 1), 3);
  EXPECT_EQ(gateway(topology, 1, 1), 4);
}

TEST_F(AtTheGateway, PlanForwardMakesHop2RowsToTheDestsOfEachHop1Row) {
  const auto& from0 = hop1.rows.from[0];
  const auto& from2 = hop1.rows.from[2];
  // To itself: its own row first, then token 10's pair for rank 3 (slot 0, origin -1) and
  // token 30's two pairs for rank 3 as one row (slot 2, origin -3).
  expect_batch(plan.hop2[3], {.token = {40, 10, 30},
                              .origin = {0, -1, -3},
                              .pair_offsets = {0, 1, 2, 4},
                              .experts = {5, 5, 8, 5},
                              .weights = {1, .75f, .5f, .25f},
                              .dests = {3, 3, 3, 3}});
  EXPECT_EQ(plan.hop2[3].data, (std::vector<const float*>{own.data(), from0.data, from2.data}));
  // To rank 4: slots 0, 1 (home 0's rows 0, 1) and 2 (home 2's row 0).
  expect_batch(plan.hop2[4], {.token = {10, 11, 30},
                              .origin = {-1, -2, -3},
                              .pair_offsets = {0, 1, 2, 3},
                              .experts = {7, 6, 6},
                              .weights = {.25f, .5f, .25f},
                              .dests = {4, 4, 4}});
  EXPECT_EQ(plan.hop2[4].data, (std::vector<const float*>{from0.data, from0.data + H, from2.data}));
  // The data pointers point into the received message, which holds the homes' rows.
  EXPECT_EQ(std::memcmp(plan.hop2[4].data[1], x0.data() + H, H * sizeof(float)), 0);
  for (int d = 0; d < 3; ++d) EXPECT_EQ(plan.hop2[d].rows(), 0u) << "rank " << d;
  EXPECT_TRUE(plan.hop1.empty());  // forwarding adds to hop 2 only
}

TEST_F(AtTheGateway, PlanForwardRefusesADestOutsideThePlan) {
  DispatchPlan small;
  small.hop2.resize(4);  // rank 4 does not exist here
  expect_error([&] { plan_forward(hop1.rows, H, small); }, ErrorKind::Internal, {"hop-1 row for rank 4"});
}

TEST_F(AtTheGateway, PreparesOneSlotPerHop1RowInReceivedOrder) {
  const GatewayAnswers g = prepare_gateway_answers(hop1.rows, AnswerFormat(H));
  // Slot 0: 2 pairs, fixed point (8 + 24); slot 1: 1 pair, fp32 (16); slot 2: 3 pairs (32).
  EXPECT_EQ(g.layout.send_bytes, (std::vector<std::size_t>{48, 0, 32, 0, 0}));
  EXPECT_EQ(g.layout.send_offsets, (std::vector<std::size_t>{0, 48, 48, 80, 80}));
  EXPECT_EQ(g.slot_offset, (std::vector<std::size_t>{0, 32, 48}));
  EXPECT_EQ(g.slot_pairs, (std::vector<std::uint32_t>{2, 1, 3}));
  EXPECT_EQ(g.first_slot, (std::vector<std::size_t>{0, 2, 2, 3, 3, 3}));
  ASSERT_EQ(g.send.size(), 80u);
  for (std::size_t i = 0; i < g.send.size(); ++i)  // full-width headers; sums start at 0
    EXPECT_EQ(g.send[i], std::byte(i == 0 || i == 48 ? 8 : 0)) << "byte " << i;
}

TEST_F(AtTheGateway, SumsItsIslandsAnswersExactly) {
  answer_island();
  ASSERT_EQ(combine_message_bytes(plan.hop2, AnswerFormat(H)), layout.recv_bytes);
  GatewayAnswers g = prepare_gateway_answers(hop1.rows, AnswerFormat(H));
  std::vector<std::int64_t> acc(H, 0);  // rank 3's own token
  EXPECT_EQ(accumulate_answers(plan.hop2, answers.data(), layout, AnswerFormat(H), acc.data(), &g), 0u);
  // The local token's answer goes to acc, weighted at home: 1 * y_own.
  EXPECT_EQ(acc, (std::vector<std::int64_t>{kOne, 2 * kOne, 3 * kOne}));
  // Slot 0 (2 pairs, answered in fp32 by ranks 3 and 4), weighted here:
  //   .75 * {1, -2, .5} * 2^32 = {3 2^30, -12 2^29, 3 2^29}
  //   .25 * {4, .5, -1} * 2^32 = {4 2^30,      2^29, -2 2^29}
  std::int64_t slot[3];
  std::memcpy(slot, fixed_row_sums(g.send.data() + g.slot_offset[0]), sizeof slot);
  EXPECT_EQ(slot[0], 7 * (std::int64_t(1) << 30));
  EXPECT_EQ(slot[1], -11 * (std::int64_t(1) << 29));
  EXPECT_EQ(slot[2], std::int64_t(1) << 29);
  // Slot 1 (a 1-pair hop-1 row): rank 4's fp32 answer, unchanged bits, padding still 0.
  EXPECT_EQ(std::memcmp(g.send.data() + g.slot_offset[1], y_c, sizeof y_c), 0);
  for (std::size_t i = 12; i < 16; ++i) EXPECT_EQ(g.send[g.slot_offset[1] + i], std::byte{0});
  // Slot 2 (3 pairs): rank 3's int64 partial plus rank 4's .25 * {8, -4, .25} * 2^32.
  std::memcpy(slot, fixed_row_sums(g.send.data() + g.slot_offset[2]), sizeof slot);
  EXPECT_EQ(slot[0], 5 + (std::int64_t(1) << 33));
  EXPECT_EQ(slot[1], -7 - kOne);
  EXPECT_EQ(slot[2], (std::int64_t(1) << 40) + (std::int64_t(1) << 28));
}

TEST_F(AtTheGateway, HomesAddTheGatewaysAnswers) {
 for (const bool narrow : {false, true}) {
  SCOPED_TRACE(narrow ? "narrowed" : "full width");
  answer_island();
  GatewayAnswers g = prepare_gateway_answers(hop1.rows, AnswerFormat(H));
  std::vector<std::int64_t> acc3(H, 0);
  accumulate_answers(plan.hop2, answers.data(), layout, AnswerFormat(H), acc3.data(), &g);
  if (narrow) {
    narrow_gateway_answers(g, AnswerFormat(H));
    // Slot 0's sums need 5 bytes (8 + 15, padded: 24), slot 2's 6 (8 + 18: 32).
    EXPECT_EQ(g.layout.send_bytes, (std::vector<std::size_t>{24 + 16, 0, 32, 0, 0}));
  } else {
    EXPECT_EQ(combine_message_bytes(home0, AnswerFormat(H))[3], g.layout.send_bytes[0]);
  }
  // Home 0 receives block 0 of the gateway's hop-1 answers (from rank 3).
  comm::ExchangeLayout back0;
  back0.recv_bytes = {0, 0, 0, g.layout.send_bytes[0], 0};
  back0.recv_offsets = {0, 0, 0, 0, g.layout.send_bytes[0]};
  std::vector<std::int64_t> acc0(2 * H, 0);
  const std::byte* block0 = g.send.data() + g.layout.send_offsets[0];
  EXPECT_EQ(accumulate_answers(home0, block0, back0, AnswerFormat(H), acc0.data(), nullptr), 0u);
  // Token 10: slot 0's sum; token 11: weighted at home, .5 * {1.5 2^-30, -0, -3} * 2^32.
  EXPECT_EQ(acc0, (std::vector<std::int64_t>{7 * (std::int64_t(1) << 30), -11 * (std::int64_t(1) << 29),
                                             std::int64_t(1) << 29, 3, 0, -3 * (std::int64_t(1) << 31)}));
  // Home 2 receives block 2: token 30 gets slot 2's sum.
  comm::ExchangeLayout back2;
  back2.recv_bytes = {0, 0, 0, g.layout.send_bytes[2], 0};
  back2.recv_offsets = {0, 0, 0, 0, g.layout.send_bytes[2]};
  std::vector<std::int64_t> acc2(H, 0);
  const std::byte* block2 = g.send.data() + g.layout.send_offsets[2];
  EXPECT_EQ(accumulate_answers(home2, block2, back2, AnswerFormat(H), acc2.data(), nullptr), 0u);
  EXPECT_EQ(acc2, (std::vector<std::int64_t>{5 + (std::int64_t(1) << 33), -7 - kOne,
                                             (std::int64_t(1) << 40) + (std::int64_t(1) << 28)}));
 }
}

TEST_F(AtTheGateway, AnAnswerForASlotNeedsTheGatewaysAnswers) {
  answer_island();
  std::vector<std::int64_t> acc(H, 0);
  expect_error([&] { accumulate_answers(plan.hop2, answers.data(), layout, AnswerFormat(H), acc.data(), nullptr); },
               ErrorKind::Internal, {"gateway slot", "forwarded nothing"});
}

}  // namespace
}  // namespace moed::runtime
