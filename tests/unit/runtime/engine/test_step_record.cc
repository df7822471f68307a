// The per-step reduction as a pure function: a rank's block decodes to what
// was encoded; over ranks, times are maxed, counts summed, the non-finite
// counts merged, the traces joined, each rank's waits kept; the figures
// that are not reduced are rank 0's own.
#include "runtime/engine/step_record.h"

#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "common/error.h"

namespace moed::runtime {
namespace {

constexpr int kLayers = 3;

// A record whose every figure depends on `seed`, so that a figure carried
// to the wrong place, or not at all, shows.
StepRecord record(int seed) {
  const double s = seed;
  const auto n = std::uint64_t(seed);
  StepRecord r;
  r.total = 1 + s, r.route = 2 + s, r.plan = 3 + s, r.rows_wait = 4 + s;
  r.experts = 5 + s, r.answers_wait = 6 + s, r.other = 7 + s, r.shared = 8.5 + s;
  for (int l = 0; l < kLayers; ++l) {
    r.rows_wait_per_layer.push_back(10 * (l + 1) + s);
    r.answers_wait_per_layer.push_back(100 * (l + 1) - s);  // smaller with the seed: the max is not one rank's
    r.tokens_per_layer.push_back(1000 * std::uint64_t(l + 1) + n);
  }
  r.bytes_copied = 11 + n;
  for (std::size_t c = 0; c < r.bytes_sent.size(); ++c) r.bytes_sent[c] = 20 + c + n;
  r.saturated = 12 + n;
  r.token_layers = 13 + n;
  r.router.tokens = 30 + n, r.router.pairs = 31 + n, r.router.moved = 32 + n, r.router.dropped = 33 + n;
  r.router.weight_moved = 34 + n, r.router.weight_dropped = 35 + n, r.router.flip_tested = 36 + n;
  r.router.flipped = 37 + n, r.router.jitter_tested = 38 + n, r.router.jitter_changed = {39 + n, 40 + n};
  r.router.selected = 41 + n, r.router.changed = 42 + n;
  r.add_nonfinite(7, 2 + n);
  r.add_nonfinite(std::uint32_t(100 + seed), 1);
  trace::HomeRecord home;
  home.at = {std::uint64_t(seed), seed, 1};
  home.request_id = 50 + n;
  r.trace.homes.push_back(home);
  // Not reduced: rank 0's own.
  r.pairs = 60 + n;
  r.expert_load = {n, n + 1};
  r.routed_rows_by_rank = {n};
  return r;
}

std::vector<std::uint64_t> router_words(const StepRecord& r) {
  const auto w = r.router.words();
  return {w.begin(), w.end()};
}

std::vector<std::byte> blocks_of(const std::vector<StepRecord>& ranks) {
  std::vector<std::byte> all;
  for (const StepRecord& r : ranks) {
    const std::vector<std::byte> block = encode_step_figures(r);
    all.insert(all.end(), block.begin(), block.end());
  }
  return all;
}

// Every figure the reduction carries, the non-finite counts and the traces.
void expect_same_figures(const StepRecord& got, const StepRecord& want) {
  EXPECT_EQ(got.total, want.total);
  EXPECT_EQ(got.route, want.route);
  EXPECT_EQ(got.plan, want.plan);
  EXPECT_EQ(got.rows_wait, want.rows_wait);
  EXPECT_EQ(got.experts, want.experts);
  EXPECT_EQ(got.answers_wait, want.answers_wait);
  EXPECT_EQ(got.other, want.other);
  EXPECT_EQ(got.rows_wait_per_layer, want.rows_wait_per_layer);
  EXPECT_EQ(got.answers_wait_per_layer, want.answers_wait_per_layer);
  EXPECT_EQ(got.bytes_sent, want.bytes_sent);
  EXPECT_EQ(got.saturated, want.saturated);
  EXPECT_EQ(got.token_layers, want.token_layers);
  EXPECT_EQ(got.bytes_copied, want.bytes_copied);
  EXPECT_EQ(router_words(got), router_words(want));
  EXPECT_EQ(got.tokens_per_layer, want.tokens_per_layer);
  EXPECT_EQ(got.nonfinite, want.nonfinite);
  ASSERT_EQ(got.trace.homes.size(), want.trace.homes.size());
  for (std::size_t i = 0; i < got.trace.homes.size(); ++i) {
    EXPECT_EQ(got.trace.homes[i].at, want.trace.homes[i].at) << i;
    EXPECT_EQ(got.trace.homes[i].request_id, want.trace.homes[i].request_id) << i;
  }
}

TEST(StepFigures, ABlockDecodesToWhatWasEncoded) {
  const StepRecord r = record(5);
  const std::vector<std::byte> block = encode_step_figures(r);
  std::span<const std::byte> rest(block);
  const StepRecord back = decode_step_figures(rest, r, 0, 0);
  EXPECT_TRUE(rest.empty());
  expect_same_figures(back, r);
  // Not carried: the per-rank census, the job-wide loads.
  EXPECT_EQ(back.pairs, 0u);
  EXPECT_TRUE(back.expert_load.empty());
  EXPECT_TRUE(back.routed_rows_by_rank.empty());
}

TEST(StepFigures, AHealthyUntracedBlockIsTheFiguresAndTwoZeroCounts) {
  StepRecord r = record(1);
  r.nonfinite.clear();
  r.trace.clear();
  const std::size_t figures = 8 + 2 * kLayers;  // doubles
  const std::size_t counts = r.bytes_sent.size() + 3 + RouterCounters::kWords + kLayers;
  EXPECT_EQ(encode_step_figures(r).size(), (figures + counts + 2) * 8);
}

TEST(StepFigures, TimesAreMaxedCountsSummedOverRanks) {
  const std::vector<StepRecord> ranks{record(0), record(3), record(1)};
  const StepRecord out = reduce_step_figures(ranks[0], blocks_of(ranks), 3, 9);
  EXPECT_EQ(out.total, 4.0);
  EXPECT_EQ(out.route, 5.0);
  EXPECT_EQ(out.plan, 6.0);
  EXPECT_EQ(out.rows_wait, 7.0);
  EXPECT_EQ(out.experts, 8.0);
  EXPECT_EQ(out.answers_wait, 9.0);
  EXPECT_EQ(out.other, 10.0);
  EXPECT_EQ(out.shared, 11.5);
  EXPECT_EQ(out.rows_wait_per_layer, (std::vector<double>{13, 23, 33}));
  EXPECT_EQ(out.answers_wait_per_layer, (std::vector<double>{100, 200, 300}));  // rank 0's, the largest
  for (std::size_t c = 0; c < out.bytes_sent.size(); ++c) EXPECT_EQ(out.bytes_sent[c], 3 * (20 + c) + 4) << c;
  EXPECT_EQ(out.saturated, 3 * 12 + 4u);
  EXPECT_EQ(out.token_layers, 3 * 13 + 4u);
  EXPECT_EQ(out.bytes_copied, 3 * 11 + 4u);
  const std::vector<std::uint64_t> router = router_words(out);
  for (std::size_t w = 0; w < router.size(); ++w) EXPECT_EQ(router[w], 3 * (30 + w) + 4) << w;
  EXPECT_EQ(out.tokens_per_layer, (std::vector<std::uint64_t>{3004, 6004, 9004}));
}

TEST(StepFigures, TheReductionKeepsEachRanksWaitsAndJoinsTheRest) {
  const std::vector<StepRecord> ranks{record(0), record(3), record(1)};
  const StepRecord out = reduce_step_figures(ranks[0], blocks_of(ranks), 3, 9);
  EXPECT_EQ(out.rows_wait_by_rank, (std::vector<double>{10, 20, 30, 13, 23, 33, 11, 21, 31}));
  EXPECT_EQ(out.answers_wait_by_rank, (std::vector<double>{100, 200, 300, 97, 197, 297, 99, 199, 299}));
  // Expert 7 on every rank, summed; each rank's own expert after it, in rank order.
  const std::vector<std::pair<std::uint32_t, std::uint64_t>> nonfinite{{7, 2 + 5 + 3}, {100, 1}, {103, 1}, {101, 1}};
  EXPECT_EQ(out.nonfinite, nonfinite);
  ASSERT_EQ(out.trace.homes.size(), 3u);
  for (std::size_t r = 0; r < 3; ++r) EXPECT_EQ(out.trace.homes[r].at, ranks[r].trace.homes[0].at) << r;
  // Rank 0's own, not reduced.
  EXPECT_EQ(out.pairs, ranks[0].pairs);
  EXPECT_EQ(out.expert_load, ranks[0].expert_load);
  EXPECT_EQ(out.routed_rows_by_rank, ranks[0].routed_rows_by_rank);
}

TEST(StepFigures, OneRankReducesToItsOwnFigures) {
  const StepRecord r = record(2);
  const StepRecord out = reduce_step_figures(r, encode_step_figures(r), 1, 0);
  expect_same_figures(out, r);
  EXPECT_EQ(out.rows_wait_by_rank, r.rows_wait_per_layer);
  EXPECT_EQ(out.answers_wait_by_rank, r.answers_wait_per_layer);
}

TEST(StepFigures, BlocksThatDoNotParseAreRefused) {
  const std::vector<StepRecord> ranks{record(0), record(1)};
  std::vector<std::byte> all = blocks_of(ranks);
  EXPECT_THROW(reduce_step_figures(ranks[0], all, 3, 4), Error);  // a rank short
  EXPECT_THROW(reduce_step_figures(ranks[0], all, 1, 4), Error);  // a rank left over
  std::vector<std::byte> cut(all.begin(), all.end() - 1);
  EXPECT_THROW(reduce_step_figures(ranks[0], cut, 2, 4), Error);
  // A trace byte count (a block's last word, when it traces nothing) past the end.
  StepRecord untraced = record(0);
  untraced.trace.clear();
  std::vector<std::byte> one = encode_step_figures(untraced);
  const std::uint64_t huge = 1 << 20;
  std::memcpy(one.data() + one.size() - 8, &huge, 8);
  EXPECT_THROW(reduce_step_figures(untraced, one, 1, 4), Error);
}

}  // namespace
}  // namespace moed::runtime
