// Single-token traces, the pure parts (runtime/trace/): which requests are
// sampled or followed, the records' wire form, their join on rank 0, the
// bounded ring and the JSON a trace is shown as.
#include <gtest/gtest.h>

#include <cstdint>
#include <cmath>
#include <vector>

#include "common/error.h"
#include "runtime/control/control_messages.h"
#include "runtime/trace/token_identity.h"
#include "runtime/workload/token_order.h"
#include "runtime/trace/trace_assembly.h"
#include "runtime/trace/trace_records.h"
#include "runtime/trace/trace_selector.h"
#include "runtime/trace/tracer.h"
#include "tests/unit/runtime/trace_fixture.h"

namespace moed::runtime::trace {
namespace {

// ---- sampling -----------------------------------------------------------------------------

class SampledFraction : public ::testing::TestWithParam<double> {};

TEST_P(SampledFraction, IsTheConfiguredShareOfRequests) {
  const double sample = GetParam();
  const TraceSelector selector(sample, 4);
  constexpr std::uint64_t kIds = 400000;
  std::uint64_t hits = 0;
  for (std::uint64_t id = 0; id < kIds; ++id) hits += selector.sampled(id);
  const double expected = sample * kIds;
  EXPECT_NEAR(double(hits), expected, 5 * std::sqrt(expected + 1) + 1) << "sample " << sample;
}

INSTANTIATE_TEST_SUITE_P(Rates, SampledFraction, ::testing::Values(0.0, 0.0005, 0.001, 0.01, 0.5, 1.0));

TEST(TraceSelector, EveryRankTakesTheSameDecisionFromTheIdAlone) {
  const TraceSelector a(0.01, 4), b(0.01, 4);
  std::uint64_t sampled = 0;
  for (std::uint64_t id = 0; id < 100000; ++id) {
    ASSERT_EQ(a.sampled(id), b.sampled(id)) << id;
    sampled += a.sampled(id);
  }
  EXPECT_GT(sampled, 0u);
  // Consecutive ids (a step's tokens) are not sampled in runs: the hash spreads them.
  std::uint64_t runs = 0;
  for (std::uint64_t id = 1; id < 100000; ++id) runs += a.sampled(id) && a.sampled(id - 1);
  EXPECT_LT(runs, sampled / 10);
}

TEST(TraceSelector, ZeroIsOffUntilAnIdIsFollowed) {
  TraceSelector s(0.0, 2);
  EXPECT_TRUE(s.idle());
  EXPECT_FALSE(s.wants(5));
  s.follow(5);
  EXPECT_FALSE(s.idle());
  EXPECT_TRUE(s.wants(5));
  EXPECT_FALSE(s.sampled(5));
  EXPECT_FALSE(s.wants(6));
}

TEST(TraceSelector, FollowedIdsAreBoundedOldestFirst) {
  TraceSelector s(0.0, 2);
  s.follow(1);
  s.follow(2);
  s.follow(2);  // already followed: no change
  EXPECT_TRUE(s.followed(1));
  s.follow(3);
  EXPECT_FALSE(s.followed(1)) << "the oldest is dropped";
  EXPECT_TRUE(s.followed(2));
  EXPECT_TRUE(s.followed(3));
}

TEST(TraceSelector, RefusesARateOutsideZeroToOne) {
  EXPECT_THROW(TraceSelector(1.5, 1), Error);
  EXPECT_THROW(TraceSelector(-0.1, 1), Error);
}

TEST(TokenIdentity, IsTheRequestTagOfTheRouterPolicies) {
  const TokenIdentity w = identity_of(request_of_token(1234, 64, 1));  // one position per request
  EXPECT_EQ(w.request_id, 1234u);
  EXPECT_EQ(w.position, 0u);
  // 4 positions per request: token 5 x 64 + 7 (step 5, slot 7) is position 5 mod 4 of request (5 / 4) x 64 + 7.
  const TokenIdentity s = identity_of(request_of_token(5 * 64 + 7, 64, 4));
  EXPECT_EQ(s.request_id, 1u * 64 + 7);
  EXPECT_EQ(s.position, 1u);
  const TokenIdentity f = identity_of({9, 3});
  EXPECT_EQ(f.request_id, 9u);
  EXPECT_EQ(f.position, 3u);
}

// ---- records ------------------------------------------------------------------------------

TEST(TraceRecords, RoundTripThroughTheirBytes) {
  TraceFragments f = token_layer(5, 0);
  f.append(token_layer(6, 1, 200));
  const std::vector<std::byte> bytes = encode_fragments(f);
  TraceFragments back;
  decode_fragments(bytes.data(), bytes.size(), "test", back);
  ASSERT_EQ(back.homes.size(), 2u);
  EXPECT_EQ(back.homes[1].request_id, 6u);
  EXPECT_EQ(back.homes[1].at, (TraceKey{200, 1, 1}));
  ASSERT_EQ(back.visits.size(), 4u);
  EXPECT_EQ(back.visits[0].expert, 4u);
  EXPECT_FLOAT_EQ(back.legs[1].back_us, 280);
  EXPECT_FLOAT_EQ(back.choices[0].weight, 0.75f);
}

TEST(TraceRecords, NothingTracedIsNoBytes) {
  EXPECT_TRUE(encode_fragments(TraceFragments{}).empty());
  TraceFragments back;
  decode_fragments(nullptr, 0, "test", back);
  EXPECT_TRUE(back.empty());
}

TEST(TraceRecords, ATruncatedBlockIsAnError) {
  const std::vector<std::byte> bytes = encode_fragments(token_layer(5, 0));
  for (std::size_t cut : {std::size_t(3), std::size_t(40), bytes.size() - 1}) {
    TraceFragments back;
    EXPECT_THROW(decode_fragments(bytes.data(), cut, "test", back), Error) << cut;
  }
  std::vector<std::byte> longer = bytes;
  longer.push_back(std::byte{0});
  TraceFragments back;
  EXPECT_THROW(decode_fragments(longer.data(), longer.size(), "test", back), Error);
}

TEST(TraceRecords, TheFollowedIdsTravelWithTheBoundaryActions) {
  BoundaryActions a;
  a.follow = {7, 1ull << 40};
  EXPECT_FALSE(encode_actions(a).empty());
  EXPECT_EQ(decode_actions(encode_actions(a)), a);
  EXPECT_TRUE(encode_actions(BoundaryActions{}).empty()) << "the usual boundary stays empty";
}

// ---- assembly and ring --------------------------------------------------------------------

TEST(TraceAssembly, JoinsEachHomesRecordsByKey) {
  TraceFragments step = token_layer(5, 0, 100);
  step.append(token_layer(6, 0, 101));
  step.visits.push_back({{999, 3, 0}, 3, 1, 2, 1, 0, 1, 2, 3});  // no home record: dropped
  const std::vector<LayerTrace> layers = assemble(step);
  ASSERT_EQ(layers.size(), 2u);
  for (const LayerTrace& l : layers) {
    EXPECT_EQ(l.choices.size(), 2u);
    EXPECT_EQ(l.legs.size(), 2u);
    ASSERT_EQ(l.visits.size(), 2u);
    EXPECT_EQ(l.visits[0].expert, 0u) << "visits by expert";
    for (const VisitRecord& v : l.visits) EXPECT_EQ(v.at, l.home.at);
  }
}

TEST(TraceRing, KeepsTheLastTokensWithTheirLayersInOrder) {
  TraceRing ring(2, 3);
  for (int layer : {2, 0, 1}) ring.add(assemble(token_layer(5, layer))[0]);
  ring.add(assemble(token_layer(6, 0))[0]);
  ASSERT_EQ(ring.find(5).size(), 1u);
  const TokenTrace t = ring.find(5)[0];
  ASSERT_EQ(t.layers.size(), 3u);
  for (int l = 0; l < 3; ++l) EXPECT_EQ(t.layers[l].home.at.layer, l);
  ring.add(assemble(token_layer(5, 0))[0]);  // served again: replaces, no new entry
  EXPECT_EQ(ring.size(), 2u);
  EXPECT_EQ(ring.find(5)[0].layers.size(), 3u);
  ring.add(assemble(token_layer(7, 0))[0]);  // a third token: the oldest (5) goes
  EXPECT_EQ(ring.size(), 2u);
  EXPECT_TRUE(ring.find(5).empty());
  EXPECT_EQ(ring.find(6).size(), 1u);
  EXPECT_EQ(ring.evicted(), 1u);
  ring.add(assemble(token_layer(8, 5))[0]);  // a layer the model does not have
  EXPECT_TRUE(ring.find(8).empty());
}

TEST(TraceRing, NeverGrowsPastItsCapacity) {
  TraceRing ring(16, 2);
  for (std::uint64_t id = 0; id < 1000; ++id)
    for (int l = 0; l < 2; ++l) ring.add(assemble(token_layer(id, l))[0]);
  EXPECT_EQ(ring.size(), 16u);
  EXPECT_EQ(ring.evicted(), 1000u - 16u);
  EXPECT_EQ(ring.find(999).size(), 1u);
}

// ---- JSON ---------------------------------------------------------------------------------

TEST(TraceJson, PhasesSumToTheHomesTotal) {
  TraceRing ring(4, 2);
  for (int l : {0, 1}) ring.add(assemble(token_layer(5, l))[0]);
  const nlohmann::json j = token_trace_json(ring.find(5)[0], 2);
  EXPECT_EQ(j["request_id"], 5);
  EXPECT_TRUE(j["complete"].get<bool>());
  ASSERT_EQ(j["layers"].size(), 2u);
  const nlohmann::json& l = j["layers"][0];
  const nlohmann::json& p = l["phases_us"];
  double sum = 0;
  for (const char* phase : {"route", "plan", "dispatch", "wait", "combine"}) {
    EXPECT_GE(p[phase].get<double>(), 0) << phase;
    sum += p[phase].get<double>();
  }
  EXPECT_NEAR(sum, p["total"].get<double>(), 1e-3);
  EXPECT_DOUBLE_EQ(p["total"].get<double>(), 20 + 5 + 300);
  EXPECT_DOUBLE_EQ(p["wait"].get<double>(), 280 - 8) << "until the last answer came back";
  EXPECT_EQ(l["ranks"], (std::vector<int>{1, 2}));
  EXPECT_EQ(l["islands"], (std::vector<int>{0, 1}));
  EXPECT_EQ(l["bytes"]["rows"], 544);
  EXPECT_EQ(l["bytes"]["cross_island"], 544 + 512);
  EXPECT_EQ(l["experts"][0]["expert"], 4);
  EXPECT_EQ(l["experts"][0]["rank"], 2);
  EXPECT_DOUBLE_EQ(l["experts"][0]["queue_us"].get<double>(), 20);
  EXPECT_EQ(l["slowest_expert"]["expert"], 4) << "its answer left last";
  EXPECT_DOUBLE_EQ(l["slowest_expert"]["answer_travel_us"].get<double>(), 70);
  EXPECT_DOUBLE_EQ(j["layers"][1]["at_us"].get<double>(), 1000) << "layer 1's sync came 1 ms after layer 0's";
  for (const nlohmann::json& s : l["spans"]) EXPECT_LE(s["start_us"].get<double>(), s["end_us"].get<double>());
  EXPECT_EQ(l["spans"].size(), 5u + 2 * 2) << "five home phases, a queue and an expert span per visit";
}

TEST(TraceJson, AMissingLayerIsShownIncomplete) {
  TraceRing ring(4, 3);
  ring.add(assemble(token_layer(5, 1))[0]);
  const nlohmann::json j = token_trace_json(ring.find(5)[0], 3);
  EXPECT_FALSE(j["complete"].get<bool>());
  EXPECT_EQ(j["layers_traced"], 1);
}

TEST(Tracer, AnUnknownIdIsAClearNotFound) {
  Tracer tracer(8, 2, 0.001);
  tracer.absorb(token_layer(5, 0));
  const nlohmann::json found = tracer.answer(5);
  ASSERT_TRUE(found.contains("tokens"));
  EXPECT_EQ(found["tokens"].size(), 1u);
  const nlohmann::json missing = tracer.answer(6);
  EXPECT_EQ(missing["ok"], false);
  EXPECT_EQ(missing["error"]["code"], "not_found");
  const std::string message = missing["error"]["message"];
  EXPECT_NE(message.find("no trace of request 6"), std::string::npos) << message;
  EXPECT_NE(message.find("--follow 6"), std::string::npos) << message;
}

TEST(Tracer, AFollowThatCameTooLateIsSaidAtOnceAndBounded) {
  Tracer tracer(8, 2, 0.001);
  tracer.note_too_late(7, 3, 9);
  const nlohmann::json late = tracer.answer(7);
  EXPECT_EQ(late["error"]["code"], "already_served");
  const std::string message = late["error"]["message"];
  EXPECT_NE(message.find("request 7 was served by step 3"), std::string::npos) << message;
  EXPECT_NE(message.find("at step 9"), std::string::npos) << message;
  EXPECT_EQ(tracer.answer(8)["error"]["code"], "not_found") << "only the id noted";
  // A token of it traced after all (another position) is shown, not the error.
  tracer.absorb(token_layer(7, 0));
  EXPECT_TRUE(tracer.answer(7).contains("tokens"));
  // Bounded: the oldest notes go first.
  for (std::uint64_t id = 100; id < 300; ++id) tracer.note_too_late(id, 1, 2);
  EXPECT_EQ(tracer.answer(100)["error"]["code"], "not_found");
  EXPECT_EQ(tracer.answer(299)["error"]["code"], "already_served");
}

}  // namespace
}  // namespace moed::runtime::trace
