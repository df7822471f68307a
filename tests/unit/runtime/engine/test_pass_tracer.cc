// The engine's trace side (runtime/engine/pass_tracer.h), fed by hand: a
// home's legs from its plan, with their bytes (an answer at full width in
// the pass's format until it comes back, then what came), the computing
// rank's visits (arrived, run in a call of their expert, answered), and the
// layer's part: which rows are traced, their census slots, the pass's
// observer only when it traces, the home's records.
#include "runtime/engine/pass_tracer.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <vector>

#include "placement/topology.h"
#include "runtime/engine/census.h"
#include "runtime/engine/dispatch_plan.h"
#include "runtime/engine/wire_format.h"
#include "runtime/trace/trace_selector.h"
#include "tests/unit/runtime/engine/plan_test_support.h"
#include "tests/unit/runtime/fake_fabric.h"

namespace moed::runtime {
namespace {

constexpr int H = 8;
// The layer's sync point: 0, so that offsets from it are the clock's own (and positive).
constexpr double kOrigin = 0;

// Rank 0 of islands {0, 1} and {2, 3}: token 7 (one pair) and token 9 (two
// pairs) go to rank 1; token 9 also crosses to rank 2's gateway, and comes
// to rank 0 itself.
struct HomeOfTwoTokens : ::testing::Test {
  HomeOfTwoTokens() {
    plan.hop1.resize(4);
    plan.hop2.resize(4);
    plan.hop2[0].add(9, 1, row + H, 1, .25f, 0);
    plan.hop2[1].add(7, 0, row, 3, 1, 1);
    plan.hop2[1].add(9, 1, row + H, 2, .5f, 1);
    plan.hop2[1].add(9, 1, row + H, 4, .25f, 1);
    plan.hop1[2].add(9, 1, row + H, 5, .25f, 2);
  }
  void trace(AnswerFormat format) {
    tracer.start(1, 0, topology, kOrigin, out);
    tracer.add(0, 7);
    tracer.add(0, 9);
    tracer.add(3, 40);  // another home's token: no leg here
    tracer.planned(plan, format);
  }
  const placement::Topology topology{{0, 0, 1, 1}};
  float row[2 * H] = {};
  DispatchPlan plan;
  trace::TraceFragments out;
  PassTracer tracer;
};

TEST_F(HomeOfTwoTokens, ALegPerRankItsRowGoesTo) {
  trace(AnswerFormat(H));
  ASSERT_EQ(out.legs.size(), 4u);
  // Token by token; each token's direct legs by rank, then the gateway's.
  const trace::LegRecord& seven = out.legs[0];
  EXPECT_EQ(seven.at, (trace::TraceKey{7, 0, 1}));
  EXPECT_EQ(seven.rank, 1);
  EXPECT_EQ(seven.pairs, 1u);
  EXPECT_EQ(seven.via_gateway, 0u);
  EXPECT_EQ(seven.row_bytes, 8u + 4 + 12 + 4 * H);  // token, pair count, a pair, the row
  const trace::LegRecord& own = out.legs[1];
  EXPECT_EQ(own.at, (trace::TraceKey{9, 0, 1}));
  EXPECT_EQ(own.rank, 0);
  EXPECT_EQ(own.row_bytes + own.answer_bytes, 0u);  // nothing travels
  EXPECT_EQ(out.legs[2].rank, 1);
  EXPECT_EQ(out.legs[2].pairs, 2u);
  EXPECT_EQ(out.legs[2].row_bytes, 8u + 4 + 2 * 12 + 4 * H);
  const trace::LegRecord& crossing = out.legs[3];
  EXPECT_EQ(crossing.at.key, 9u);
  EXPECT_EQ(crossing.rank, 2);
  EXPECT_EQ(crossing.island, 1);
  EXPECT_EQ(crossing.via_gateway, 1u);
  for (const trace::LegRecord& l : out.legs) EXPECT_EQ(l.back_us, -1.0f);
}

// Until its answer comes, a leg's answer bytes are the answer's full width in
// the pass's format: with several F-chunks a one-pair row is answered as a
// fixed-point sum (8 + 8 H bytes), not as fp32 (4 H).
TEST_F(HomeOfTwoTokens, AnswerBytesAreFullWidthInThePassFormat) {
  for (const bool one_chunk : {true, false}) {
    SCOPED_TRACE(one_chunk ? "one F-chunk" : "several F-chunks");
    out = {};
    const AnswerFormat format(H, one_chunk);
    trace(format);
    ASSERT_EQ(out.legs.size(), 4u);
    EXPECT_EQ(out.legs[0].answer_bytes, one_chunk ? 4u * H : 8u + 8 * H);  // token 7, one pair
    EXPECT_EQ(out.legs[1].answer_bytes, 0u);                                // token 9 at home
    EXPECT_EQ(out.legs[2].answer_bytes, 8u + 8 * H);                        // two pairs: a sum either way
    EXPECT_EQ(out.legs[3].answer_bytes, combine_row_bytes(1, format));      // one pair, through the gateway
  }
}

TEST_F(HomeOfTwoTokens, AnswersBackGiveTheBytesThatCame) {
  const AnswerFormat format(H);
  trace(format);
  // Rank 1's answers, narrowed: token 7 fp32 (32 bytes), token 9's sums in one byte each (8 + 8).
  const std::uint32_t pairs[2] = {1, 2};
  std::vector<std::byte> answers(combine_message_bytes(plan.hop2, format)[1]);
  lay_out_answers(answers.data(), pairs, 2, format);
  const std::size_t bytes = narrow_answers(answers.data(), pairs, 2, format);
  ASSERT_EQ(bytes, 4u * H + 16);
  tracer.answers_back(PassStream::direct, 1, plan.hop2[1], answers.data(), bytes);
  EXPECT_EQ(out.legs[0].answer_bytes, 4u * H);
  EXPECT_EQ(out.legs[2].answer_bytes, 16u);
  EXPECT_GT(out.legs[0].back_us, 0.0f);
  EXPECT_GT(out.legs[2].back_us, 0.0f);
  EXPECT_EQ(out.legs[1].back_us, -1.0f);  // its own rank's and the gateway's legs wait
  EXPECT_EQ(out.legs[3].back_us, -1.0f);
  tracer.answers_back(PassStream::direct, 0, plan.hop2[0], nullptr, 0);  // answered in place
  EXPECT_GT(out.legs[1].back_us, 0.0f);
  EXPECT_EQ(out.legs[1].answer_bytes, 0u);
  EXPECT_EQ(out.legs[3].back_us, -1.0f);
}

// Rank 1 computes experts 2 and 3: rows of tokens 7 and 9 arrive from home 0, token 5 (untraced) too.
TEST(PassTracer, AVisitPerPairOfATracedRow) {
  const placement::Topology topology{{0, 0, 1, 1}};
  trace::TraceFragments out;
  PassTracer tracer;
  tracer.start(1, 1, topology, kOrigin, out);
  tracer.add(0, 7);
  tracer.add(0, 9);
  tracer.planned(DispatchPlan{}, AnswerFormat(H));  // sends nothing itself
  const std::vector<float> x = token_rows(3, H);
  RowBatch from0;
  from0.add(5, 0, x.data(), 2, 1, 1);
  from0.add(7, 1, x.data() + H, 3, 1, 1);
  from0.add(9, 2, x.data() + 2 * H, 2, .5f, 1);
  from0.add(9, 2, x.data() + 2 * H, 3, .5f, 1);
  const ReceivedRows::Source rows = view_rows(from0);
  tracer.rows_arrived(PassStream::direct, 0, rows);
  ASSERT_EQ(out.visits.size(), 3u);
  EXPECT_EQ(out.visits[0].at, (trace::TraceKey{7, 0, 1}));
  EXPECT_EQ(out.visits[0].expert, 3u);
  EXPECT_EQ(out.visits[1].expert, 2u);
  EXPECT_EQ(out.visits[2].expert, 3u);
  for (const trace::VisitRecord& v : out.visits) {
    EXPECT_EQ(v.rank, 1);
    EXPECT_EQ(v.island, 0);
    EXPECT_GT(v.arrived_us, 0.0f);
    EXPECT_EQ(v.answered_us, -1.0f);
  }
  // Expert 3 runs tokens 7 and 9 (and a row of another pass): its two visits, not expert 2's.
  std::byte sink[8];
  const float other[H] = {};
  const ExpertRow call[3] = {
      {x.data() + H, sink, 1, true}, {other, sink, 1, true}, {x.data() + 2 * H, sink, .5f, false}};
  tracer.expert_ran(3, call, kOrigin + 0.5, kOrigin + 0.75);
  EXPECT_EQ(out.visits[0].start_us, 500000.0f);
  EXPECT_EQ(out.visits[0].end_us, 750000.0f);
  EXPECT_EQ(out.visits[0].call_rows, 3u);
  EXPECT_EQ(out.visits[2].call_rows, 3u);
  EXPECT_EQ(out.visits[1].call_rows, 0u);
  EXPECT_EQ(out.visits[1].start_us, 0.0f);
  tracer.answers_sent(PassStream::forward, 0);  // another stream: not these
  EXPECT_EQ(out.visits[0].answered_us, -1.0f);
  tracer.answers_sent(PassStream::direct, 0);
  for (const trace::VisitRecord& v : out.visits) EXPECT_GT(v.answered_us, 0.0f);
}

// Rows 1, 3, 4, 5, 6 and 8 of a layer's 9 are traced (their requests followed).
struct TracedLayer : ::testing::Test {
  TracedLayer() {
    for (std::uint64_t request : {101u, 103u, 104u, 105u, 106u, 108u}) selector.follow(request);
    for (std::uint32_t t = 0; t < 9; ++t) tags.push_back({100 + t, t});
    tracer.trace_with(&selector);
    tracer.select(tags);
  }
  trace::TraceSelector selector{0.0, 16};
  std::vector<TokenTag> tags;
  LayerTracer tracer{2};
};

TEST_F(TracedLayer, AnnouncesTheFirstSlotsOfAPassAsOffsets) {
  std::vector<std::uint32_t> slots(kTraceSlots, kNoTrace);
  tracer.announce(2, 7, slots);  // rows 2-8: 3, 4, 5, 6 fit, 8 does not
  EXPECT_EQ(slots, (std::vector<std::uint32_t>{1, 2, 3, 4}));
  slots.assign(kTraceSlots, kNoTrace);
  tracer.announce(0, 2, slots);
  EXPECT_EQ(slots, (std::vector<std::uint32_t>{1, kNoTrace, kNoTrace, kNoTrace}));
  LayerTracer idle{1};  // no selector
  idle.select(tags);
  slots.assign(kTraceSlots, kNoTrace);
  idle.announce(0, 9, slots);
  EXPECT_EQ(slots, std::vector<std::uint32_t>(kTraceSlots, kNoTrace));
}

TEST_F(TracedLayer, APassIsObservedOnlyWhenItTracesAndTheHomeRecordsWhatItAnnounced) {
  // One rank, two passes: rows [0, 4) and [4, 9), keys from 50; pass 0 announces row 1 only.
  LayerCensus census(1, 2, 2);
  const Routing routing = make_routing(std::vector<Pairs>(9, Pairs{{1, 1}}));
  census.write(0, routing, 0, 4, 50)[0] = 1;
  census.write(1, routing, 4, 5, 54);
  fake::Fabric fabric(5);
  census.gather(*fabric.transport(0, 1), "test census");
  const placement::Topology topology{{0}};
  EXPECT_NE(tracer.observe_pass(0, census, 2, 0, topology, kOrigin), nullptr);
  EXPECT_EQ(tracer.observe_pass(1, census, 2, 0, topology, kOrigin), nullptr);
  LayerTimes times{kOrigin - 0.25, kOrigin - 0.125, kOrigin, kOrigin + 0.5, kOrigin + 0.625, kOrigin + 1};
  tracer.record_home({2, 0, 0, 7, 3, 50, &routing}, times);
  const trace::TraceFragments f = tracer.take();
  ASSERT_EQ(f.homes.size(), 1u);  // rows 3 to 8 were traced but not announced
  const trace::HomeRecord& h = f.homes[0];
  EXPECT_EQ(h.at, (trace::TraceKey{51, 0, 2}));
  EXPECT_EQ(h.request_id, 101u);
  EXPECT_EQ(h.position, 1u);
  EXPECT_EQ(h.step, 7u);
  EXPECT_EQ(h.epoch, 3u);
  EXPECT_EQ(h.sync_s, kOrigin);
  EXPECT_EQ(h.route_us, 125000.0f);
  EXPECT_EQ(h.gather_us, 125000.0f);
  EXPECT_EQ(h.planned_us, 500000.0f);
  EXPECT_EQ(h.sent_us, 625000.0f);
  EXPECT_EQ(h.combined_us, 1e6f);
  ASSERT_EQ(f.choices.size(), 1u);
  EXPECT_EQ(f.choices[0].expert, 1u);
  EXPECT_TRUE(tracer.take().empty());
}

}  // namespace
}  // namespace moed::runtime
