// The pure middle of a layer's data path (runtime/dispatch_plan.h): counts,
// the dispatch plan and its two rules, the dispatch and combine wire formats,
// batching by expert, and a whole layer simulated in memory over 1, 3 and
// more ranks, which must give the same output bits for every placement.
#include "runtime/dispatch_plan.h"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "common/error.h"
#include "common/rng.h"
#include "kernels/cpu/fixed_combine.h"
#include "placement/placement.h"
#include "runtime/router.h"
#include "tests/unit/test_support.h"

namespace moed::runtime {
namespace {

using placement::Placement;
using Pairs = std::vector<std::pair<std::uint32_t, float>>;

Routing make_routing(const std::vector<Pairs>& tokens) {
  Routing r;
  for (const auto& t : tokens) {
    for (auto [e, w] : t) r.add(e, w);
    r.end_token();
  }
  return r;
}

using test::expect_error;

ExpertCounts counts_of(const std::vector<std::vector<std::uint32_t>>& rows) {
  ExpertCounts c(int(rows.size()), int(rows.front().size()));
  for (std::size_t r = 0; r < rows.size(); ++r)
    std::memcpy(c.data() + r * rows[r].size(), rows[r].data(), rows[r].size() * sizeof(std::uint32_t));
  return c;
}

// ---------------------------------------------------------------- ExpertCounts

TEST(ExpertCounts, LocalCountsPairsPerExpert) {
  const Routing r = make_routing({{{1, .5f}, {2, .5f}}, {{2, .7f}, {3, .3f}}, {{1, 1}}, {}});
  EXPECT_EQ(ExpertCounts::local(r, 5), (std::vector<std::uint32_t>{0, 2, 2, 1, 0}));
  EXPECT_EQ(ExpertCounts::local(Routing{}, 3), (std::vector<std::uint32_t>{0, 0, 0}));
}

TEST(ExpertCounts, TotalAndBefore) {
  const ExpertCounts c = counts_of({{1, 2, 3, 4}, {0, 5, 0, 1}, {2, 0, 7, 1}});
  EXPECT_EQ(c.ranks(), 3);
  EXPECT_EQ(c.experts(), 4);
  EXPECT_EQ(c.at(1, 1), 5u);
  EXPECT_EQ(c.at(2, 2), 7u);
  const std::uint64_t totals[] = {3, 7, 10, 6};
  for (int e = 0; e < 4; ++e) {
    EXPECT_EQ(c.total(e), totals[e]) << "expert " << e;
    EXPECT_EQ(c.before(0, e), 0u) << "expert " << e;
    EXPECT_EQ(c.before(3, e), totals[e]) << "expert " << e;  // all ranks
  }
  EXPECT_EQ(c.before(1, 0), 1u);
  EXPECT_EQ(c.before(2, 1), 7u);
  EXPECT_EQ(c.before(2, 2), 3u);
  EXPECT_EQ(c.before(1, 3), 4u);
}

// ---------------------------------------------------------------- plan_dispatch by hand

PlanInput plan_input(const Routing& r, const Placement& p, const ExpertCounts& c, int rank,
                     std::uint64_t chunk_rows = 1, std::uint64_t step = 0, int layer = 0) {
  return PlanInput{&r, &p, layer, &c, rank, chunk_rows, step};
}

void expect_destination(const DispatchPlan::Destination& d, const std::vector<std::uint32_t>& tokens,
                        const std::vector<std::uint32_t>& pair_offsets,
                        const std::vector<std::uint32_t>& experts, const std::vector<float>& weights) {
  EXPECT_EQ(d.tokens, tokens);
  EXPECT_EQ(d.pair_offsets, pair_offsets);
  EXPECT_EQ(d.experts, experts);
  EXPECT_EQ(d.weights, weights);
}

TEST(PlanDispatch, TwoExpertsOnOneRankTravelOnce) {
  // Experts 0, 1 on rank 0; 2, 3 on rank 1.
  const Placement p = placement::contiguous(2, 1, 4);
  const Routing r = make_routing({{{0, .6f}, {1, .4f}},    // both on rank 0: one row, two pairs
                                  {{2, .7f}, {0, .3f}},    // one row to each rank
                                  {{3, .55f}, {2, .45f}}}); // both on rank 1
  const ExpertCounts c = counts_of({ExpertCounts::local(r, 4), {0, 0, 0, 0}});
  const DispatchPlan plan = plan_dispatch(plan_input(r, p, c, 0));
  ASSERT_EQ(plan.to.size(), 2u);
  expect_destination(plan.to[0], {0, 1}, {0, 2, 3}, {0, 1, 0}, {.6f, .4f, .3f});
  expect_destination(plan.to[1], {1, 2}, {0, 1, 3}, {2, 3, 2}, {.7f, .55f, .45f});
  EXPECT_EQ(plan.to[0].pairs_of(0), 2u);
  EXPECT_EQ(plan.to[0].pairs_of(1), 1u);
  EXPECT_EQ(plan.to[1].pairs_of(1), 2u);
}

TEST(PlanDispatch, ExpertsOnThreeRanksMakeThreeRows) {
  Placement p(3, 1, 3);
  for (int e = 0; e < 3; ++e) p.set_replicas(0, e, {2 - e});  // expert e on rank 2 - e
  const Routing r = make_routing({{{0, .5f}, {1, .3f}, {2, .2f}}});
  const ExpertCounts c = counts_of({{1, 1, 1}, {0, 0, 0}, {0, 0, 0}});
  const DispatchPlan plan = plan_dispatch(plan_input(r, p, c, 0));
  ASSERT_EQ(plan.to.size(), 3u);
  expect_destination(plan.to[2], {0}, {0, 1}, {0}, {.5f});
  expect_destination(plan.to[1], {0}, {0, 1}, {1}, {.3f});
  expect_destination(plan.to[0], {0}, {0, 1}, {2}, {.2f});
}

TEST(PlanDispatch, RowsPerDestinationAreInTokenOrder) {
  const Placement p = placement::round_robin(2, 1, 4);  // even experts on rank 0, odd on rank 1
  const Routing r = make_routing(
      {{{1, 1}}, {{0, 1}}, {{3, .5f}, {2, .5f}}, {{2, 1}}, {{1, .5f}, {3, .5f}}, {}});
  const ExpertCounts c = counts_of({ExpertCounts::local(r, 4), {0, 0, 0, 0}});
  const DispatchPlan plan = plan_dispatch(plan_input(r, p, c, 0));
  EXPECT_EQ(plan.to[0].tokens, (std::vector<std::uint32_t>{1, 2, 3}));
  EXPECT_EQ(plan.to[1].tokens, (std::vector<std::uint32_t>{0, 2, 4}));
  EXPECT_EQ(plan.to[1].experts, (std::vector<std::uint32_t>{1, 3, 1, 3}));
}

TEST(PlanDispatch, TheLayerSelectsThePlacement) {
  Placement p(2, 2, 2);
  p.set_replicas(0, 0, {0});
  p.set_replicas(0, 1, {0});
  p.set_replicas(1, 0, {1});
  p.set_replicas(1, 1, {1});
  const Routing r = make_routing({{{0, .5f}, {1, .5f}}});
  const ExpertCounts c = counts_of({{1, 1}, {0, 0}});
  EXPECT_EQ(plan_dispatch(plan_input(r, p, c, 0, 1, 0, 0)).to[0].tokens.size(), 1u);
  EXPECT_EQ(plan_dispatch(plan_input(r, p, c, 0, 1, 0, 1)).to[1].tokens.size(), 1u);
  EXPECT_TRUE(plan_dispatch(plan_input(r, p, c, 0, 1, 0, 1)).to[0].tokens.empty());
}

// Expert 0 has two replicas, on ranks 2 (replica 0) and 0 (replica 1); expert 1 is on rank 1.
// Counts of expert 0: rank 0 has 3 pairs, rank 1 has 4, rank 2 has 2. Rank 1's pairs of
// expert 0 hold global positions 3, 4, 5, 6; with chunks of 2 rows they are in chunks
// 1, 2, 2, 3.
class PlanReplicas : public ::testing::Test {
 protected:
  PlanReplicas() : p(3, 1, 2) {
    p.set_replicas(0, 0, {2, 0});
    p.set_replicas(0, 1, {1});
  }
  Placement p;
  const Routing r = make_routing({{{0, 1}},                // position 3
                                  {{0, .6f}, {1, .4f}},    // position 4
                                  {{1, .7f}, {0, .3f}},    // position 5
                                  {{0, 1}}});              // position 6
  const ExpertCounts c = counts_of({{3, 0}, {4, 2}, {2, 0}});
};

TEST_F(PlanReplicas, ChunkJGoesToReplicaJPlusStepModR) {
  // step 1: chunks 1, 2, 2, 3 -> replicas 0, 1, 1, 0 -> ranks 2, 0, 0, 2.
  const DispatchPlan plan = plan_dispatch(plan_input(r, p, c, 1, 2, 1));
  expect_destination(plan.to[2], {0, 3}, {0, 1, 2}, {0, 0}, {1, 1});
  expect_destination(plan.to[0], {1, 2}, {0, 1, 2}, {0, 0}, {.6f, .3f});
  expect_destination(plan.to[1], {1, 2}, {0, 1, 2}, {1, 1}, {.4f, .7f});
}

TEST_F(PlanReplicas, TheStepRotatesTheReplicas) {
  // step 0: chunks 1, 2, 2, 3 -> replicas 1, 0, 0, 1 -> ranks 0, 2, 2, 0.
  const DispatchPlan plan = plan_dispatch(plan_input(r, p, c, 1, 2, 0));
  expect_destination(plan.to[0], {0, 3}, {0, 1, 2}, {0, 0}, {1, 1});
  expect_destination(plan.to[2], {1, 2}, {0, 1, 2}, {0, 0}, {.6f, .3f});
}

TEST_F(PlanReplicas, PositionsStartAfterTheLowerRanks) {
  // The same routing planned as rank 0 (positions 0..3, chunks 0, 0, 1, 1), step 0:
  // replicas 0, 0, 1, 1 -> ranks 2, 2, 0, 0.
  const ExpertCounts c0 = counts_of({{4, 2}, {3, 0}, {2, 0}});
  const DispatchPlan plan = plan_dispatch(plan_input(r, p, c0, 0, 2, 0));
  expect_destination(plan.to[2], {0, 1}, {0, 1, 2}, {0, 0}, {1, .6f});
  expect_destination(plan.to[0], {2, 3}, {0, 1, 2}, {0, 0}, {.3f, 1});
}

// With islands, a chunk goes to a replica on the island most of its rows come
// from. Islands {0, 1} and {2, 3}; expert 0 has replicas on ranks 1 and 3.
// Counts of expert 0: rank 0 has 5 rows (positions 0-4), rank 2 has 3 (5-7).
// Chunks of 4 rows: chunk 0 = positions 0-3, all from island 0 -> rank 1;
// chunk 1 = positions 4-7: 1 row from island 0, 3 from island 1 -> rank 3.
TEST(ChunkReplica, FollowsTheIslandOfMostOfTheChunksRows) {
  Placement p(4, 1, 2);
  p.set_replicas(0, 0, {1, 3});
  p.set_replicas(0, 1, {0});
  const ExpertCounts c = counts_of({{5, 0}, {0, 0}, {3, 0}, {0, 0}});
  const placement::Topology islands = placement::Topology::blocks(4, 2);
  const Routing none;
  for (std::uint64_t step : {0, 1, 5}) {
    PlanInput in{&none, &p, 0, &c, 0, 4, step, &islands};
    EXPECT_EQ(p.replicas(0, 0)[chunk_replica(in, 0, 0)], 1) << "step " << step;
    EXPECT_EQ(p.replicas(0, 0)[chunk_replica(in, 0, 1)], 3) << "step " << step;
  }
  // Without a topology the replicas rotate: chunk j -> replica (j + step) mod 2.
  PlanInput flat{&none, &p, 0, &c, 0, 4, 1, nullptr};
  EXPECT_EQ(chunk_replica(flat, 0, 0), 1u);
  EXPECT_EQ(chunk_replica(flat, 0, 1), 0u);
}

// Two replicas on the island the rows come from rotate with the step; an
// island with no replica falls back to all replicas.
TEST(ChunkReplica, RotatesAmongTheNearReplicasAndFallsBackToAll) {
  Placement p(4, 1, 1);
  p.set_replicas(0, 0, {0, 1, 2});
  const ExpertCounts from_island0 = counts_of({{8}, {0}, {0}, {0}});
  const ExpertCounts from_island1 = counts_of({{0}, {0}, {0}, {8}});
  const placement::Topology islands = placement::Topology::blocks(4, 2);
  const Routing none;
  PlanInput a{&none, &p, 0, &from_island0, 0, 8, 0, &islands};
  EXPECT_EQ(chunk_replica(a, 0, 0), 0u);  // near replicas {0, 1}: (0 + 0) mod 2
  a.step = 1;
  EXPECT_EQ(chunk_replica(a, 0, 0), 1u);
  PlanInput b{&none, &p, 0, &from_island1, 0, 8, 0, &islands};
  EXPECT_EQ(chunk_replica(b, 0, 0), 2u);  // rank 2 is the only replica on island 1
  Placement q(4, 1, 1);
  q.set_replicas(0, 0, {0, 1});
  PlanInput c{&none, &q, 0, &from_island1, 0, 8, 1, &islands};
  EXPECT_EQ(chunk_replica(c, 0, 0), 1u);  // none on island 1: all replicas, (0 + 1) mod 2
}

TEST(ReplicaOfChunk, IsChunkPlusStepModReplicas) {
  EXPECT_EQ(replica_of_chunk(0, 0, 1), 0u);
  EXPECT_EQ(replica_of_chunk(5, 0, 1), 0u);
  EXPECT_EQ(replica_of_chunk(0, 0, 3), 0u);
  EXPECT_EQ(replica_of_chunk(1, 0, 3), 1u);
  EXPECT_EQ(replica_of_chunk(2, 2, 3), 1u);
  EXPECT_EQ(replica_of_chunk(4, 7, 2), 1u);
}

// ---------------------------------------------------------------- dispatch wire format

struct MessageSize {
  std::size_t rows, pairs;
  int hidden;
  std::size_t bytes;
};

class DispatchMessageBytes : public ::testing::TestWithParam<MessageSize> {};

TEST_P(DispatchMessageBytes, HeaderAndDataEachPaddedTo16) {
  const auto& m = GetParam();
  EXPECT_EQ(dispatch_message_bytes(m.rows, m.pairs, m.hidden), m.bytes);
  EXPECT_EQ(m.bytes % 16, 0u);
}

INSTANTIATE_TEST_SUITE_P(
    Sizes, DispatchMessageBytes,
    ::testing::Values(MessageSize{0, 0, 5, 16},     // 8 -> 16, no data
                      MessageSize{2, 3, 5, 96},     // 4*(2+2+3) + 4*3 = 40 -> 48; 40 -> 48
                      MessageSize{1, 1, 4, 48},     // 16 + 4 = 20 -> 32; 16
                      MessageSize{3, 3, 1, 64},     // 32 + 12 = 44 -> 48; 12 -> 16
                      MessageSize{1, 2, 8, 64}));   // 20 + 8 = 28 -> 32; 32

// Token rows with awkward bits: signed zeros, a denormal, NaN and infinity payloads.
std::vector<float> odd_rows(std::size_t tokens, int hidden, std::uint64_t seed) {
  CounterRng rng(seed);
  std::vector<float> x(tokens * hidden);
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = std::bit_cast<float>(std::uint32_t(rng.bits(i)));
  x[0] = -0.0f;
  if (x.size() > 2) x[1] = 0x1p-140f, x[2] = std::bit_cast<float>(0x7fc01234u);
  return x;
}

TEST(DispatchWire, PackThenParseGivesThePlanBack) {
  const int H = 5;
  const Placement p = placement::contiguous(3, 1, 6);  // experts 0-1, 2-3, 4-5
  const Routing r = make_routing({{{0, .6f}, {1, .4f}},
                                  {{2, .7f}, {0, .3f}},
                                  {{3, .55f}, {2, .45f}},
                                  {{1, .9f}, {3, .1f}}});
  const ExpertCounts c = counts_of({ExpertCounts::local(r, 6), std::vector<std::uint32_t>(6, 0),
                                    std::vector<std::uint32_t>(6, 0)});
  const DispatchPlan plan = plan_dispatch(plan_input(r, p, c, 0));
  const std::vector<float> x = odd_rows(4, H, 3);

  std::vector<std::byte> buffer(4096, std::byte{0xCD});  // stale bytes that padding must clear
  comm::ExchangeLayout layout;
  pack_dispatch(plan, x.data(), H, buffer, layout);

  // rank 0: 3 rows, 4 pairs; rank 1: 3 rows, 4 pairs; rank 2: none.
  const std::vector<std::size_t> bytes = {dispatch_message_bytes(3, 4, H),
                                          dispatch_message_bytes(3, 4, H),
                                          dispatch_message_bytes(0, 0, H)};
  EXPECT_EQ(layout.send_bytes, bytes);
  EXPECT_EQ(layout.send_offsets, (std::vector<std::size_t>{0, bytes[0], bytes[0] + bytes[1]}));
  EXPECT_EQ(buffer.size(), bytes[0] + bytes[1] + bytes[2]);

  // Read it back as if each message had come from the rank it was sent to.
  layout.recv_bytes = layout.send_bytes;
  layout.recv_offsets = layout.send_offsets;
  const ReceivedRows received = parse_dispatch(buffer.data(), layout, H);
  ASSERT_EQ(received.from.size(), 3u);
  for (std::size_t d = 0; d < 3; ++d) {
    const auto& src = received.from[d];
    const auto& dest = plan.to[d];
    ASSERT_EQ(src.rows, dest.tokens.size()) << "rank " << d;
    ASSERT_EQ(src.pairs, dest.experts.size()) << "rank " << d;
    for (std::uint32_t row = 0; row < src.rows; ++row) {
      EXPECT_EQ(src.pairs_per_row[row], dest.pairs_of(row));
      EXPECT_EQ(src.first_pair[row], dest.pair_offsets[row]);
      EXPECT_EQ(std::memcmp(src.data + std::size_t(row) * H, x.data() + std::size_t(dest.tokens[row]) * H,
                            H * sizeof(float)),
                0)
          << "rank " << d << " row " << row;
    }
    for (std::uint32_t i = 0; i < src.pairs; ++i) {
      EXPECT_EQ(src.experts[i], dest.experts[i]);
      EXPECT_EQ(std::bit_cast<std::uint32_t>(src.weights[i]), std::bit_cast<std::uint32_t>(dest.weights[i]));
    }
    // Fields aligned, padding zero.
    const std::byte* start = buffer.data() + layout.send_offsets[d];
    EXPECT_EQ(reinterpret_cast<std::uintptr_t>(src.data) % 16,
              reinterpret_cast<std::uintptr_t>(start) % 16);
    const std::size_t meta = 4 * (2 + src.rows + src.pairs) + 4 * src.pairs;
    const std::size_t data_at = std::size_t(reinterpret_cast<const std::byte*>(src.data) - start);
    EXPECT_EQ(data_at, (meta + 15) / 16 * 16);
    for (std::size_t b = meta; b < data_at; ++b)
      EXPECT_EQ(start[b], std::byte{0}) << "rank " << d << " header padding byte " << b;
    for (std::size_t b = data_at + std::size_t(src.rows) * H * 4; b < layout.send_bytes[d]; ++b)
      EXPECT_EQ(start[b], std::byte{0}) << "rank " << d << " data padding byte " << b;
  }
}

class DispatchWireErrors : public ::testing::Test {
 protected:
  void SetUp() override {
    const Placement p = placement::contiguous(1, 1, 2);
    r = make_routing({{{0, .5f}, {1, .5f}}, {{1, 1}}});
    c = counts_of({ExpertCounts::local(r, 2)});
    plan = plan_dispatch(plan_input(r, p, c, 0));
    x.assign(2 * H, 1.0f);
    pack_dispatch(plan, x.data(), H, buffer, layout);
    layout.recv_bytes = layout.send_bytes;
    layout.recv_offsets = layout.send_offsets;
  }
  std::uint32_t* words() { return reinterpret_cast<std::uint32_t*>(buffer.data()); }

  static constexpr int H = 4;
  Routing r;
  ExpertCounts c;
  DispatchPlan plan;
  std::vector<float> x;
  std::vector<std::byte> buffer;
  comm::ExchangeLayout layout;
};

TEST_F(DispatchWireErrors, SizeThatDisagreesWithTheHeader) {
  ASSERT_EQ(words()[0], 2u);  // rows
  ASSERT_EQ(words()[1], 3u);  // pairs
  layout.recv_bytes[0] -= 16;
  expect_error([&] { parse_dispatch(buffer.data(), layout, H); }, ErrorKind::Internal,
               {"rank 0", "bytes"});
}

TEST_F(DispatchWireErrors, TooShortForAHeader) {
  layout.recv_bytes[0] = 4;
  expect_error([&] { parse_dispatch(buffer.data(), layout, H); }, ErrorKind::Internal,
               {"rank 0", "4 bytes"});
}

TEST_F(DispatchWireErrors, PairsPerRowThatDisagreeWithTheHeader) {
  ASSERT_EQ(words()[2], 2u);
  words()[2] = 1;  // rows now hold 2 pairs, the header says 3
  expect_error([&] { parse_dispatch(buffer.data(), layout, H); }, ErrorKind::Internal,
               {"rank 0", "2 pairs", "3"});
}

TEST_F(DispatchWireErrors, RowWithoutPairs) {
  words()[3] = 0;
  expect_error([&] { parse_dispatch(buffer.data(), layout, H); }, ErrorKind::Internal,
               {"row 1", "no pair"});
}

// ---------------------------------------------------------------- combine wire format

struct RowBytes {
  std::uint32_t pairs;
  int hidden;
  std::size_t bytes;
};

class CombineRowBytes : public ::testing::TestWithParam<RowBytes> {};

TEST_P(CombineRowBytes, Fp32PaddedTo8ForOnePairInt64ForMore) {
  EXPECT_EQ(combine_row_bytes(GetParam().pairs, GetParam().hidden), GetParam().bytes);
}

INSTANTIATE_TEST_SUITE_P(Sizes, CombineRowBytes,
                         ::testing::Values(RowBytes{1, 5, 24}, RowBytes{1, 4, 16}, RowBytes{1, 1, 8},
                                           RowBytes{2, 5, 40}, RowBytes{3, 4, 32}, RowBytes{2, 1, 8},
                                           RowBytes{8, 3, 24}));

// Home rank 0 of two ranks: two rows went to rank 1, token 0 with one pair (expert 2,
// weight 0.25), token 1 with two pairs.
DispatchPlan hand_plan() {
  DispatchPlan plan;
  plan.to.resize(2);
  plan.to[1].tokens = {0, 1};
  plan.to[1].pair_offsets = {0, 1, 3};
  plan.to[1].experts = {2, 3, 1};
  plan.to[1].weights = {0.25f, 0.5f, 0.5f};
  return plan;
}

TEST(CombineWire, MessageBytesByPairCount) {
  const int H = 3;
  EXPECT_EQ(combine_message_bytes(hand_plan(), H), (std::vector<std::size_t>{0, 16 + 24}));
}

// The return from rank 1: an fp32 row (3 floats + 4 bytes padding), then an int64 row.
std::vector<std::byte> hand_return(const float y[3], const std::int64_t partial[3]) {
  std::vector<std::byte> buf(40, std::byte{0xFF});  // padding bytes are garbage on purpose
  std::memcpy(buf.data(), y, 12);
  std::memcpy(buf.data() + 16, partial, 24);
  return buf;
}

TEST(CombineWire, AccumulateReturnsWeightsAtHomeAndAddsPartials) {
  const int H = 3;
  const DispatchPlan plan = hand_plan();
  const float y[3] = {1.0f, -2.0f, 0x1.8p-31f};
  const std::int64_t partial[3] = {5, -7, std::int64_t(1) << 40};
  const std::vector<std::byte> recv = hand_return(y, partial);
  comm::ExchangeLayout layout;
  layout.recv_bytes = {0, 40};
  layout.recv_offsets = {0, 0};
  std::vector<std::int64_t> acc = {1, 2, 3, 4, 5, 6};
  EXPECT_EQ(accumulate_returns(plan, recv.data(), layout, H, acc.data()), 0u);
  // Token 0: 0.25 * y * 2^32 = {2^30, -2^31, 0.75 -> rounds to 1}, added to {1, 2, 3}.
  EXPECT_EQ(acc[0], 1 + (std::int64_t(1) << 30));
  EXPECT_EQ(acc[1], 2 - (std::int64_t(1) << 31));
  EXPECT_EQ(acc[2], 3 + 1);
  // Token 1: the partial as it came.
  EXPECT_EQ(acc[3], 4 + 5);
  EXPECT_EQ(acc[4], 5 - 7);
  EXPECT_EQ(acc[5], 6 + (std::int64_t(1) << 40));
}

TEST(CombineWire, AccumulateReturnsCountsSaturatedTerms) {
  const int H = 3;
  const DispatchPlan plan = hand_plan();
  // 0.25 * 4e10 * 2^32 = 4.3e19 > 2^62: saturates at +-2^62.
  const float y[3] = {4e10f, -4e10f, 1.0f};
  const std::int64_t partial[3] = {0, 0, 0};
  const std::vector<std::byte> recv = hand_return(y, partial);
  comm::ExchangeLayout layout;
  layout.recv_bytes = {0, 40};
  layout.recv_offsets = {0, 0};
  std::vector<std::int64_t> acc(6, 0);
  EXPECT_EQ(accumulate_returns(plan, recv.data(), layout, H, acc.data()), 2u);
  EXPECT_EQ(acc[0], std::int64_t(1) << 62);
  EXPECT_EQ(acc[1], -(std::int64_t(1) << 62));
  EXPECT_EQ(acc[2], std::int64_t(1) << 30);
}

TEST(CombineWire, AccumulateReturnsRefusesAWrongSize) {
  const int H = 3;
  const DispatchPlan plan = hand_plan();
  const float y[3] = {0, 0, 0};
  const std::int64_t partial[3] = {0, 0, 0};
  std::vector<std::byte> recv = hand_return(y, partial);
  recv.resize(64);
  comm::ExchangeLayout layout;
  layout.recv_bytes = {0, 48};
  layout.recv_offsets = {0, 0};
  std::vector<std::int64_t> acc(6, 0);
  expect_error([&] { accumulate_returns(plan, recv.data(), layout, H, acc.data()); },
               ErrorKind::Internal, {"rank 1", "48"});
}

// ---------------------------------------------------------------- a layer in memory

// One rank's side of one layer.
struct RankSide {
  std::uint64_t first = 0;  // global id of its token 0
  std::size_t count = 0;
  Routing routing;
  std::vector<float> x;     // its tokens' rows
  DispatchPlan plan;
  std::vector<std::byte> send, recv, back_send, back_recv;
  comm::ExchangeLayout layout, back_layout;
  ReceivedRows received;
  std::vector<ExpertBatch> batches;
  std::vector<float> out;   // its tokens' outputs
};

struct LayerRun {
  int ranks;
  int layer;
  int hidden;
  std::uint64_t chunk_rows, step;
  const Placement* placement;
  ExpertCounts counts;
  std::vector<RankSide> side;

  PlanInput input(int r) const {
    return PlanInput{&side[r].routing, placement, layer, &counts, r, chunk_rows, step};
  }
};

// An all-to-all-v in memory: block d of rank s's send lands in rank d's receive buffer,
// blocks in source order. Fills the receive halves of the layouts.
void all_to_all(std::vector<RankSide>& side, std::vector<std::byte> RankSide::*send,
                comm::ExchangeLayout RankSide::*layout, std::vector<std::byte> RankSide::*recv) {
  const std::size_t R = side.size();
  for (std::size_t d = 0; d < R; ++d) {
    comm::ExchangeLayout& in = side[d].*layout;
    in.recv_bytes.assign(R, 0);
    in.recv_offsets.assign(R, 0);
    std::size_t at = 0;
    for (std::size_t s = 0; s < R; ++s) {
      in.recv_offsets[s] = at;
      in.recv_bytes[s] = (side[s].*layout).send_bytes[d];
      at += in.recv_bytes[s];
    }
    (side[d].*recv).assign(at, std::byte{0});
    for (std::size_t s = 0; s < R; ++s) {
      const comm::ExchangeLayout& out = side[s].*layout;
      std::memcpy((side[d].*recv).data() + in.recv_offsets[s], (side[s].*send).data() + out.send_offsets[d],
                  out.send_bytes[d]);
    }
  }
}

// Global tokens: rows and routing. The routing of a token is its own: the same whatever
// rank it sits on.
struct Tokens {
  std::size_t count;
  int hidden, experts;
  std::vector<float> x;
  Routing routing;
};

Tokens make_tokens(std::size_t n, int hidden, int experts, int top_k, std::uint64_t seed) {
  Tokens t{n, hidden, experts, {}, {}};
  CounterRng rng(seed);
  t.x.resize(n * hidden);
  for (std::size_t i = 0; i < t.x.size(); ++i) t.x[i] = 2.0f * rng.normalish(i);
  CounterRng lrng(seed + 1);
  std::vector<float> logits(n * experts);
  for (std::size_t i = 0; i < logits.size(); ++i) logits[i] = 2.0f * lrng.normalish(i);
  RouterParams p;
  p.top_k = top_k;
  route(logits.data(), n, experts, p, t.routing);
  return t;
}

// Splits the global tokens evenly by rank (as the engine does) and runs plan, pack,
// exchange, parse and batch on every rank.
LayerRun dispatch_layer(const Tokens& tokens, const Placement& placement, int layer,
                        std::uint64_t chunk_rows, std::uint64_t step) {
  const int R = placement.ranks(), H = tokens.hidden, E = tokens.experts;
  LayerRun run{R, layer, H, chunk_rows, step, &placement, ExpertCounts(R, E), std::vector<RankSide>(R)};
  for (int r = 0; r < R; ++r) {
    RankSide& s = run.side[r];
    s.first = tokens.count * r / R;
    s.count = tokens.count * (r + 1) / R - s.first;
    s.x.assign(tokens.x.begin() + s.first * H, tokens.x.begin() + (s.first + s.count) * H);
    for (std::size_t t = 0; t < s.count; ++t) {
      auto e = tokens.routing.experts_of(s.first + t);
      auto w = tokens.routing.weights_of(s.first + t);
      for (std::size_t i = 0; i < e.size(); ++i) s.routing.add(e[i], w[i]);
      s.routing.end_token();
    }
    const std::vector<std::uint32_t> mine = ExpertCounts::local(s.routing, E);
    std::memcpy(run.counts.data() + std::size_t(r) * E, mine.data(), E * sizeof(std::uint32_t));
  }
  for (int r = 0; r < R; ++r) {
    RankSide& s = run.side[r];
    s.plan = plan_dispatch(run.input(r));
    pack_dispatch(s.plan, s.x.data(), H, s.send, s.layout);
  }
  all_to_all(run.side, &RankSide::send, &RankSide::layout, &RankSide::recv);
  for (int r = 0; r < R; ++r) {
    RankSide& s = run.side[r];
    s.received = parse_dispatch(s.recv.data(), s.layout, H);
    s.batches = batch_by_expert(s.received, run.input(r));
  }
  return run;
}

// The fake expert: y = x * (expert + 1), elementwise.
void fake_expert(int expert, const float* x, int hidden, float* y) {
  for (int i = 0; i < hidden; ++i) y[i] = x[i] * float(expert + 1);
}

// Writes the combine messages as ExpertExecutor does: one answer per received row, fp32
// unweighted for a single pair, int64 fixed-point weighted sums otherwise.
void run_fake_experts(RankSide& s, int H) {
  s.back_layout.send_bytes = combine_message_bytes(s.received, H);
  s.back_layout.send_offsets.assign(s.back_layout.send_bytes.size(), 0);
  for (std::size_t d = 1; d < s.back_layout.send_bytes.size(); ++d)
    s.back_layout.send_offsets[d] = s.back_layout.send_offsets[d - 1] + s.back_layout.send_bytes[d - 1];
  s.back_send.assign(s.back_layout.send_offsets.back() + s.back_layout.send_bytes.back(), std::byte{0});
  std::vector<std::vector<std::size_t>> row_at(s.received.from.size());
  for (std::size_t src = 0; src < s.received.from.size(); ++src) {
    std::size_t at = s.back_layout.send_offsets[src];
    for (std::uint32_t row = 0; row < s.received.from[src].rows; ++row) {
      row_at[src].push_back(at);
      at += combine_row_bytes(s.received.from[src].pairs_per_row[row], H);
    }
  }
  std::vector<float> y(H);
  for (const ExpertBatch& b : s.batches) {
    std::size_t first = 0;
    for (std::uint32_t m : b.chunk_rows) {
      for (std::uint32_t i = 0; i < m; ++i) {
        const ExpertBatch::Row& row = b.rows[first + i];
        const auto& src = s.received.from[row.source];
        fake_expert(b.expert, src.data + std::size_t(row.row) * H, H, y.data());
        std::byte* out = s.back_send.data() + row_at[row.source][row.row];
        if (src.pairs_per_row[row.row] == 1)
          std::memcpy(out, y.data(), H * sizeof(float));
        else
          kernels::add_weighted_fixed(reinterpret_cast<std::int64_t*>(out), y.data(), src.weights[row.pair], H);
      }
      first += m;
    }
  }
}

// The whole layer: dispatch, fake experts, combine, residual. Returns the global outputs.
std::vector<float> run_layer(const Tokens& tokens, const Placement& placement, int layer,
                             std::uint64_t chunk_rows, std::uint64_t step) {
  LayerRun run = dispatch_layer(tokens, placement, layer, chunk_rows, step);
  const int H = tokens.hidden;
  for (RankSide& s : run.side) run_fake_experts(s, H);
  all_to_all(run.side, &RankSide::back_send, &RankSide::back_layout, &RankSide::back_recv);
  std::vector<float> out(tokens.count * H);
  for (RankSide& s : run.side) {
    // What the home rank expects back agrees with what the experts sent.
    EXPECT_EQ(s.back_layout.recv_bytes, combine_message_bytes(s.plan, H));
    std::vector<std::int64_t> acc(s.count * H, 0);
    EXPECT_EQ(accumulate_returns(s.plan, s.back_recv.data(), s.back_layout, H, acc.data()), 0u);
    kernels::residual_from_fixed(s.x.data(), acc.data(), s.count * H, out.data() + s.first * H);
  }
  return out;
}

// The placements the layer is checked under; layer 1 of 2 is the one served.
struct PlacementCase {
  const char* name;
  std::function<Placement()> make;
};

constexpr int kExperts = 6, kLayers = 2, kLayer = 1;

Placement everywhere_thrice() {
  // 4 ranks, each expert on three of them, replica order rotating.
  Placement p(4, kLayers, kExperts);
  for (int l = 0; l < kLayers; ++l)
    for (int e = 0; e < kExperts; ++e) p.set_replicas(l, e, {e % 4, (e + 1) % 4, (e + 2) % 4});
  return p;
}

const std::vector<PlacementCase>& placement_cases() {
  static const std::vector<PlacementCase> cases = {
      {"OneRank", [] { return placement::contiguous(1, kLayers, kExperts); }},
      {"ThreeRanksContiguous", [] { return placement::contiguous(3, kLayers, kExperts); }},
      {"ThreeRanksShuffledWithReplicas",
       [] { return placement::add_random_replicas(placement::shuffled(3, kLayers, kExperts, 17), 4, 5); }},
      {"FiveRanksSomeWithoutExperts", [] { return placement::contiguous(5, kLayers, kExperts); }},
      {"FourRanksThreeReplicasEach", everywhere_thrice},
  };
  return cases;
}

bool has_replicas(const Placement& p, int layer) {
  for (int e = 0; e < p.experts(); ++e)
    if (p.replicas(layer, e).size() > 1) return true;
  return false;
}

TEST(PlacementCases, ShuffledCaseReallyHasReplicas) {
  // Otherwise the replica path of the layer tests would not be exercised.
  EXPECT_TRUE(has_replicas(placement_cases()[2].make(), kLayer));
  EXPECT_TRUE(has_replicas(placement_cases()[4].make(), kLayer));
  EXPECT_FALSE(has_replicas(placement_cases()[1].make(), kLayer));
  for (const auto& c : placement_cases()) EXPECT_NO_THROW(c.make().validate(c.name));
}

class LayerInMemory : public ::testing::TestWithParam<std::size_t> {
 protected:
  const PlacementCase& which() const { return placement_cases()[GetParam()]; }
  // 37 tokens, top-3 of 6 experts, H = 7 (odd: padded rows), chunks of 3 rows, step 5.
  const Tokens tokens = make_tokens(37, 7, kExperts, 3, 99);
  static constexpr std::uint64_t kChunk = 3, kStep = 5;
};

std::string case_name(const ::testing::TestParamInfo<std::size_t>& info) {
  return placement_cases()[info.param].name;
}

TEST_P(LayerInMemory, CombineSizesAgreeOnBothSides) {
  const Placement p = which().make();
  LayerRun run = dispatch_layer(tokens, p, kLayer, kChunk, kStep);
  for (int r = 0; r < run.ranks; ++r)
    for (int s = 0; s < run.ranks; ++s)
      EXPECT_EQ(combine_message_bytes(run.side[r].received, tokens.hidden)[s],
                combine_message_bytes(run.side[s].plan, tokens.hidden)[r])
          << "rank " << r << " answering rank " << s;
}

TEST_P(LayerInMemory, EveryTokenTravelsOnceToEachRankOfItsExperts) {
  const Placement p = which().make();
  LayerRun run = dispatch_layer(tokens, p, kLayer, kChunk, kStep);
  std::size_t pairs = 0;
  for (const RankSide& s : run.side)
    for (const auto& d : s.plan.to) {
      pairs += d.experts.size();
      for (std::size_t i = 1; i < d.tokens.size(); ++i) EXPECT_LT(d.tokens[i - 1], d.tokens[i]);
    }
  EXPECT_EQ(pairs, tokens.routing.pairs());
}

TEST_P(LayerInMemory, BatchesFollowTheChunkRule) {
  const Placement p = which().make();
  LayerRun run = dispatch_layer(tokens, p, kLayer, kChunk, kStep);
  const int H = tokens.hidden;
  bool split = false;  // some expert's rows divided between replicas
  for (int e = 0; e < kExperts; ++e) {
    // Expert e's pairs in global token order, by a plain walk over the global routing.
    std::vector<std::uint64_t> global;
    std::vector<float> weight;
    for (std::size_t t = 0; t < tokens.count; ++t)
      for (std::size_t i = 0; i < tokens.routing.experts_of(t).size(); ++i)
        if (tokens.routing.experts_of(t)[i] == std::uint32_t(e)) {
          global.push_back(t);
          weight.push_back(tokens.routing.weights_of(t)[i]);
        }
    EXPECT_EQ(run.counts.total(e), global.size());
    const std::vector<int>& replicas = p.replicas(kLayer, e);
    for (std::size_t k = 0; k < replicas.size(); ++k) {
      // Chunk j (rows [3j, 3j + 3)) belongs to replica (j + step) mod R.
      std::vector<std::uint64_t> want_tokens;
      std::vector<float> want_weights;
      std::vector<std::uint32_t> want_chunks;
      for (std::size_t j = 0; j * kChunk < global.size(); ++j) {
        if ((j + kStep) % replicas.size() != k) continue;
        const std::size_t end = std::min<std::size_t>(global.size(), (j + 1) * kChunk);
        want_chunks.push_back(std::uint32_t(end - j * kChunk));
        for (std::size_t q = j * kChunk; q < end; ++q) {
          want_tokens.push_back(global[q]);
          want_weights.push_back(weight[q]);
        }
      }
      const RankSide& holder = run.side[replicas[k]];
      const ExpertBatch* batch = nullptr;
      for (const auto& b : holder.batches)
        if (b.expert == e) batch = &b;
      ASSERT_NE(batch, nullptr) << "expert " << e << " has no batch on rank " << replicas[k];
      EXPECT_EQ(batch->chunk_rows, want_chunks) << "expert " << e << " replica " << k;
      std::uint64_t sum = 0;
      for (auto m : batch->chunk_rows) sum += m;
      EXPECT_EQ(sum, batch->rows.size());
      ASSERT_EQ(batch->rows.size(), want_tokens.size()) << "expert " << e << " replica " << k;
      split |= replicas.size() > 1 && !want_tokens.empty() && want_tokens.size() < global.size();
      for (std::size_t i = 0; i < batch->rows.size(); ++i) {
        const auto& row = batch->rows[i];
        const RankSide& source = run.side[row.source];
        const auto& src = holder.received.from[row.source];
        const std::uint64_t token = source.first + source.plan.to[replicas[k]].tokens[row.row];
        EXPECT_EQ(token, want_tokens[i]) << "expert " << e << " replica " << k << " row " << i;
        EXPECT_EQ(src.experts[row.pair], std::uint32_t(e));
        EXPECT_EQ(src.weights[row.pair], want_weights[i]);
        EXPECT_EQ(std::memcmp(src.data + std::size_t(row.row) * H, tokens.x.data() + token * H,
                              H * sizeof(float)),
                  0);
      }
    }
  }
  if (has_replicas(p, kLayer)) {
    EXPECT_TRUE(split) << "no expert was split between its replicas";
  }
  // Every rank's batches are exactly its local experts, ascending.
  for (int r = 0; r < run.ranks; ++r) {
    std::vector<int> experts;
    for (const auto& b : run.side[r].batches) experts.push_back(b.expert);
    EXPECT_EQ(experts, p.experts_on(kLayer, r)) << "rank " << r;
  }
}

TEST_P(LayerInMemory, CountsThatDisagreeWithTheRowsAreAnInternalError) {
  const Placement p = which().make();
  LayerRun run = dispatch_layer(tokens, p, kLayer, kChunk, kStep);
  // Claim more pairs of expert 0 than were sent: two more chunks for each of its replicas,
  // so that every replica expects more rows than it received.
  const int e = 0;
  const int holder = p.replicas(kLayer, e)[0];
  run.counts.data()[e] += std::uint32_t(2 * kChunk * p.replicas(kLayer, e).size());
  expect_error([&] { batch_by_expert(run.side[holder].received, run.input(holder)); },
               ErrorKind::Internal,
               {"expert " + std::to_string(e), "rank " + std::to_string(holder)});
}

TEST_P(LayerInMemory, OutputMatchesAPlainSum) {
  const Placement p = which().make();
  const std::vector<float> out = run_layer(tokens, p, kLayer, kChunk, kStep);
  const int H = tokens.hidden;
  for (std::size_t t = 0; t < tokens.count; ++t)
    for (int i = 0; i < H; ++i) {
      const double x = tokens.x[t * H + i];
      double want = x;
      for (std::size_t k = 0; k < tokens.routing.experts_of(t).size(); ++k)
        want += double(tokens.routing.weights_of(t)[k]) * x * double(tokens.routing.experts_of(t)[k] + 1);
      EXPECT_NEAR(out[t * H + i], want, 1e-5 * (1 + std::abs(want))) << "token " << t << " element " << i;
    }
}

TEST_P(LayerInMemory, OutputBitsEqualTheOneRankRun) {
  const std::vector<float> one = run_layer(tokens, placement_cases()[0].make(), kLayer, kChunk, kStep);
  const std::vector<float> here = run_layer(tokens, which().make(), kLayer, kChunk, kStep);
  ASSERT_EQ(one.size(), here.size());
  for (std::size_t i = 0; i < one.size(); ++i)
    ASSERT_EQ(std::bit_cast<std::uint32_t>(one[i]), std::bit_cast<std::uint32_t>(here[i]))
        << "token " << i / tokens.hidden << " element " << i % tokens.hidden;
}

INSTANTIATE_TEST_SUITE_P(Placements, LayerInMemory,
                         ::testing::Range<std::size_t>(0, placement_cases().size()), case_name);

TEST(LayerInMemoryErrors, ARowForAnExpertTheRankDoesNotHold) {
  // Plan with one placement, batch with another in which expert 0 moved away from rank 0.
  const Tokens tokens = make_tokens(8, 4, 2, 1, 3);
  const Placement p = placement::contiguous(2, 1, 2);  // expert 0 on rank 0, 1 on rank 1
  LayerRun run = dispatch_layer(tokens, p, 0, 4, 0);
  ASSERT_GT(run.counts.total(0), 0u);
  Placement moved(2, 1, 2);
  moved.set_replicas(0, 0, {1});
  moved.set_replicas(0, 1, {0});
  PlanInput in = run.input(0);
  in.placement = &moved;
  expect_error([&] { batch_by_expert(run.side[0].received, in); }, ErrorKind::Internal,
               {"rank 0", "expert 0", "does not hold"});
}

}  // namespace
}  // namespace moed::runtime
