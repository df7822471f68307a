// The report: figures of hand-made step records, worked out by hand.
#include "runtime/report.h"

#include <gtest/gtest.h>

#include <cmath>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

namespace moed::runtime {
namespace {

// 2 layers x 4 experts, 100 tokens per step, one warm-up step.
RunInfo run_info(std::uint64_t warmup = 1) {
  RunInfo info;
  info.ranks = 3;
  info.islands = 2;
  info.shape = ModelShape{2, 4, 2, 16, 32};
  info.tokens_per_step = 100;
  info.steps = 4;
  info.warmup_steps = warmup;
  info.transport = "mpi";
  info.workload = "synthetic";
  info.placement = "contiguous";
  return info;
}

StepRecord record(double total, std::vector<double> dispatch, std::vector<double> combine,
                  std::array<std::uint64_t, 3> bytes, std::vector<std::uint64_t> load,
                  std::uint64_t pairs) {
  StepRecord r;
  r.total = total;
  r.route = total / 10, r.plan = total / 20, r.dispatch = total / 4, r.experts = total / 2;
  r.combine = total / 5;
  r.dispatch_a2a = std::move(dispatch);
  r.combine_a2a = std::move(combine);
  r.bytes_sent = bytes;
  r.expert_load = std::move(load);
  r.pairs = pairs;
  return r;
}

// Step 0 is warm-up and absurd in every figure; steps 1-3 are measured.
// Loads per step: layer 0's four experts, then layer 1's.
class ReportTest : public ::testing::Test {
 protected:
  void SetUp() override {
    report.add_step(0, record(100.0, {50, 50}, {60, 60}, {1000000, 1000000, 1000000},
                              {400, 0, 0, 0, 400, 0, 0, 0}, 100000));
    // Measured step 1 is outside the load window of 2 steps.
    report.add_step(1, record(0.1, {0.001, 0.002}, {0.004, 0.002}, {1, 2, 3},
                              {100, 0, 100, 0, 200, 0, 0, 0}, 400));
    report.add_step(2, record(0.2, {0.003, 0.004}, {0.001, 0.003}, {10, 20, 30},
                              {10, 20, 30, 40, 0, 0, 0, 100}, 400));
    report.add_step(3, record(0.4, {0.010, 0.005}, {0.002, 0.005}, {100, 200, 300},
                              {30, 20, 10, 0, 0, 0, 0, 100}, 300));
  }
  Report report{run_info(), 2};
};

TEST_F(ReportTest, WarmUpIsLeftOut) {
  EXPECT_EQ(report.summary().measured_steps, 3u);
}

TEST_F(ReportTest, TokensPerSecond) {
  // 100 tokens x 3 steps over 0.1 + 0.2 + 0.4 s.
  EXPECT_NEAR(report.summary().tokens_per_s, 300 / 0.7, 1e-9);
}

TEST_F(ReportTest, StepLatencyPercentiles) {
  // Totals 100, 200, 400 ms. p50: 200; p99: position 0.99 x 2 = 1.98 -> 200 + 0.98 x 200.
  const Summary s = report.summary();
  EXPECT_NEAR(s.step_p50_ms, 200, 1e-9);
  EXPECT_NEAR(s.step_p99_ms, 396, 1e-9);
}

TEST_F(ReportTest, AllToAllPercentilesOverPerLayerSamples) {
  // Dispatch samples (ms): 1 2 3 4 10 5 -> sorted 1 2 3 4 5 10.
  // p50: position 2.5 -> 3.5; p99: position 4.95 -> 5 + 0.95 x 5 = 9.75.
  // Combine samples: 4 2 1 3 2 5 -> sorted 1 2 2 3 4 5: p50 2.5, p99 4 + 0.95 = 4.95.
  const Summary s = report.summary();
  EXPECT_NEAR(s.dispatch_p50_ms, 3.5, 1e-9);
  EXPECT_NEAR(s.dispatch_p99_ms, 9.75, 1e-9);
  EXPECT_NEAR(s.combine_p50_ms, 2.5, 1e-9);
  EXPECT_NEAR(s.combine_p99_ms, 4.95, 1e-9);
}

TEST_F(ReportTest, PhasesAreMeansPerMeasuredStep) {
  // route = total / 10: (10 + 20 + 40) / 3 ms.
  const Summary s = report.summary();
  EXPECT_NEAR(s.route_ms, 70.0 / 3, 1e-9);
  EXPECT_NEAR(s.experts_ms, 350.0 / 3, 1e-9);
}

TEST_F(ReportTest, ActivationRate) {
  // Pairs 400 + 400 + 300 = 1100 over 100 tokens x 3 steps x 2 layers x 4 experts.
  const Summary s = report.summary();
  EXPECT_NEAR(s.activation_rate, 1100.0 / 2400, 1e-12);
  EXPECT_NEAR(s.experts_per_token, 1100.0 / 600, 1e-12);
}

TEST_F(ReportTest, LoadSpreadOverTheWindowOnly) {
  // Window: steps 2 and 3. Layer 0: 10+30, 20+20, 30+10, 40+0 = 40 each: std 0, max/mean 1.
  // Layer 1: 0, 0, 0, 200: mean 50, std sqrt((3 x 50^2 + 150^2) / 4) = sqrt(7500):
  // std/mean sqrt(3), max/mean 4. Means over layers: sqrt(3) / 2 and 2.5.
  const Summary s = report.summary();
  EXPECT_NEAR(s.load_std_over_mean, std::sqrt(3.0) / 2, 1e-12);
  EXPECT_NEAR(s.load_max_over_mean, 2.5, 1e-12);
}

TEST_F(ReportTest, BytesSummedByClass) {
  const Summary s = report.summary();
  EXPECT_EQ(s.bytes[0], 111u);
  EXPECT_EQ(s.bytes[1], 222u);
  EXPECT_EQ(s.bytes[2], 333u);
}

TEST_F(ReportTest, JsonHasTheGoldenSignals) {
  const nlohmann::json j = report.to_json();
  ASSERT_TRUE(j.contains("tokens_per_s"));
  EXPECT_NEAR(j["tokens_per_s"].get<double>(), 300 / 0.7, 1e-9);
  EXPECT_NEAR(j.at("step_latency_ms").at("p50").get<double>(), 200, 1e-9);
  EXPECT_NEAR(j.at("step_latency_ms").at("p99").get<double>(), 396, 1e-9);
  EXPECT_NEAR(j.at("dispatch_latency_ms").at("p50").get<double>(), 3.5, 1e-9);
  EXPECT_NEAR(j.at("dispatch_latency_ms").at("p99").get<double>(), 9.75, 1e-9);
  EXPECT_NEAR(j.at("combine_latency_ms").at("p50").get<double>(), 2.5, 1e-9);
  EXPECT_NEAR(j.at("combine_latency_ms").at("p99").get<double>(), 4.95, 1e-9);
  EXPECT_NEAR(j.at("activation_rate").get<double>(), 1100.0 / 2400, 1e-12);
  EXPECT_NEAR(j.at("expert_load_std_over_mean").get<double>(), std::sqrt(3.0) / 2, 1e-12);
  EXPECT_EQ(j.at("bytes_sent").at("same_rank").get<std::uint64_t>(), 111u);
  EXPECT_EQ(j.at("bytes_sent").at("same_island").get<std::uint64_t>(), 222u);
  EXPECT_EQ(j.at("bytes_sent").at("cross_island").get<std::uint64_t>(), 333u);
  EXPECT_EQ(j.at("measured_steps").get<std::uint64_t>(), 3u);
}

TEST_F(ReportTest, PrintNamesTheFigures) {
  std::ostringstream os;
  report.print(os);
  const std::string text = os.str();
  EXPECT_NE(text.find("tokens/s           429"), std::string::npos) << text;
  EXPECT_NE(text.find("p50 200.00 ms   p99 396.00 ms"), std::string::npos) << text;
}

TEST(Report, WindowLongerThanTheRunCoversEveryMeasuredStep) {
  Report r(run_info(0), 100);
  r.add_step(0, record(1, {1}, {1}, {0, 0, 0}, {4, 0, 0, 0, 1, 1, 1, 1}, 8));
  r.add_step(1, record(1, {1}, {1}, {0, 0, 0}, {0, 4, 0, 0, 1, 1, 1, 1}, 8));
  // Layer 0: 4, 4, 0, 0: mean 2, std 2 -> 1. Layer 1: 2 each -> 0.
  EXPECT_NEAR(r.summary().load_std_over_mean, 0.5, 1e-12);
  EXPECT_EQ(r.summary().measured_steps, 2u);
}

TEST(Report, OnlyWarmUpGivesZerosNotNaN) {
  Report r(run_info(2), 8);
  r.add_step(0, record(1, {1}, {1}, {5, 5, 5}, std::vector<std::uint64_t>(8, 1), 8));
  const Summary s = r.summary();
  EXPECT_EQ(s.measured_steps, 0u);
  EXPECT_EQ(s.tokens_per_s, 0.0);
  EXPECT_EQ(s.bytes[0], 0u);
  const nlohmann::json j = r.to_json();
  EXPECT_EQ(j.at("tokens_per_s").get<double>(), 0.0);
}

}  // namespace
}  // namespace moed::runtime
