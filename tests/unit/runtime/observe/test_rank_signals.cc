// The golden signals per rank: each rank's routed tokens over the load
// window, and its own waits over the recent window.
#include "runtime/observe/rank_signals.h"

#include <gtest/gtest.h>

#include "common/error.h"

#include <cmath>

#include "common/summary_stats.h"

namespace moed::runtime {
namespace {

constexpr int kRanks = 2, kLayers = 2, kExperts = 4;

// Rank r routes `rows` tokens per layer, top-2: rank 0 evenly, rank 1 all on experts 0 and 1.
StepRecord step(std::uint64_t rows, double rank1_wait_s) {
  StepRecord rec;
  rec.routed_rows_by_rank.assign(kRanks * kLayers, rows);
  rec.routed_load_by_rank.assign(kRanks * kLayers * kExperts, 0);
  for (int l = 0; l < kLayers; ++l) {
    for (int e = 0; e < kExperts; ++e) rec.routed_load_by_rank[std::size_t(l * kExperts + e)] = rows / 2;
    const std::size_t r1 = std::size_t((kLayers + l) * kExperts);
    rec.routed_load_by_rank[r1] = rec.routed_load_by_rank[r1 + 1] = rows;
  }
  rec.rows_wait_by_rank = {0.001, 0.001, rank1_wait_s, rank1_wait_s};
  rec.answers_wait_by_rank = {0.002, 0.002, 0.0, 0.0};
  return rec;
}

TEST(RankSignals, EachRankItsOwnRoutingAndWaits) {
  RankSignals s(kRanks, kLayers, kExperts, 4, 8);
  EXPECT_TRUE(s.figures().empty());
  for (int i = 0; i < 3; ++i) s.add_step(step(10, 0.005));
  const std::vector<RankFigures> f = s.figures();
  ASSERT_EQ(f.size(), 2u);
  EXPECT_TRUE(f[0].routed && f[1].routed);
  EXPECT_DOUBLE_EQ(f[0].activation_rate, 0.5);  // top-2 of 4
  EXPECT_DOUBLE_EQ(f[1].activation_rate, 0.5);
  EXPECT_DOUBLE_EQ(f[0].load_std_over_mean, 0.0);
  EXPECT_DOUBLE_EQ(f[1].load_std_over_mean, std_over_mean({1, 1, 0, 0}));
  EXPECT_DOUBLE_EQ(f[0].alltoall_p99_ms, 2.0);  // its combine wait is the larger
  EXPECT_DOUBLE_EQ(f[1].alltoall_p99_ms, 5.0);
}

TEST(RankSignals, TheWindowsForgetOldSteps) {
  RankSignals s(kRanks, kLayers, kExperts, 2, 1);  // load window 2 steps; waits: the last step's layers
  s.add_step(step(10, 0.050));
  // Then rank 1 routes nothing and waits little.
  for (int i = 0; i < 2; ++i) {
    StepRecord rec = step(10, 0.001);
    for (int l = 0; l < kLayers; ++l) rec.routed_rows_by_rank[std::size_t(kLayers + l)] = 0;
    std::fill(rec.routed_load_by_rank.begin() + kLayers * kExperts, rec.routed_load_by_rank.end(), 0);
    s.add_step(rec);
  }
  const std::vector<RankFigures> f = s.figures();
  EXPECT_FALSE(f[1].routed);
  EXPECT_EQ(f[1].activation_rate, 0.0);
  EXPECT_DOUBLE_EQ(f[1].alltoall_p99_ms, 1.0);
  EXPECT_TRUE(f[0].routed);
}

TEST(RankSignals, IgnoresRecordsWithoutPerRankFiguresAndRefusesOtherShapes) {
  RankSignals s(kRanks, kLayers, kExperts, 4, 8);
  s.add_step(StepRecord{});
  EXPECT_TRUE(s.figures().empty());
  StepRecord bad = step(10, 0.001);
  bad.routed_rows_by_rank.pop_back();
  EXPECT_THROW(s.add_step(bad), Error);
}

}  // namespace
}  // namespace moed::runtime
