// The report: figures of hand-made step records, worked out by hand.
#include "runtime/observe/report.h"

#include "runtime/observe/prometheus_text.h"

#include "common/summary_stats.h"
#include "tests/unit/test_support.h"

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
  info.shape = ModelShape{2, 4, 2, 16, 32, {}};
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
  r.route = total / 10, r.plan = total / 20, r.rows_wait = total / 4, r.experts = total / 2;
  r.answers_wait = total / 5;
  r.rows_wait_per_layer = std::move(dispatch);
  r.answers_wait_per_layer = std::move(combine);
  r.bytes_sent = bytes;
  r.expert_load = std::move(load);
  r.pairs = pairs;
  r.token_layers = 100 * 2;  // run_info(): 100 tokens per step through 2 layers
  r.tokens_per_layer = {100, 100};
  return r;
}

// Step 0 is warm-up and absurd in every figure; steps 1-3 are measured.
// Loads per step: layer 0's four experts, then layer 1's.
// Steps come one after the other on rank 0's clock: a boundary, the step,
// then its wall time `wall` later the next boundary.
void feed(Report& r, double& clock, std::uint64_t step, const StepRecord& rec, double wall) {
  r.boundary(clock);
  r.add_step(step, rec);
  clock += wall;
}

class ReportTest : public ::testing::Test {
 protected:
  void SetUp() override {
    // Wall time is each step's engine time here, plus 0.1 s on the warm-up.
    add(0, 100.1, record(100.0, {50, 50}, {60, 60}, {1000000, 1000000, 1000000},
                              {400, 0, 0, 0, 400, 0, 0, 0}, 100000));
    // Measured step 1 is outside the load window of 2 steps.
    add(1, 0.1, record(0.1, {0.001, 0.002}, {0.004, 0.002}, {1, 2, 3},
                              {100, 0, 100, 0, 200, 0, 0, 0}, 400));
    add(2, 0.2, record(0.2, {0.003, 0.004}, {0.001, 0.003}, {10, 20, 30},
                              {10, 20, 30, 40, 0, 0, 0, 100}, 400));
    add(3, 0.4, record(0.4, {0.010, 0.005}, {0.002, 0.005}, {100, 200, 300},
                              {30, 20, 10, 0, 0, 0, 0, 100}, 300));
  }
  void add(std::uint64_t step, double wall, const StepRecord& rec) { feed(report, clock, step, rec, wall); }
  void TearDown() override {}
  Summary summary() {
    report.boundary(clock);  // closes the last step
    return report.summary();
  }
  Report report{run_info(), 2};
  double clock = 1000;
};

TEST_F(ReportTest, WarmUpIsLeftOut) {
  EXPECT_EQ(summary().measured_steps, 3u);
}

TEST_F(ReportTest, TokensPerSecond) {
  // 100 tokens x 3 steps over 0.1 + 0.2 + 0.4 s.
  EXPECT_NEAR(summary().tokens_per_s, 300 / 0.7, 1e-9);
}

// Percentiles are nearest-rank, from a streaming histogram: within its
// relative error, and exact at the extremes.
double within(double want) { return want * QuantileHistogram::relative_error(); }

TEST_F(ReportTest, StepLatencyPercentiles) {
  // Totals 100, 200, 400 ms. p50: rank ceil(1.5) = 2 -> 200; p99: rank 3 -> 400, the maximum.
  const Summary s = summary();
  EXPECT_NEAR(s.step_p50_ms, 200, within(200));
  EXPECT_NEAR(s.step_p99_ms, 400, 1e-6);
}

TEST_F(ReportTest, AllToAllPercentilesOverPerLayerSamples) {
  // Dispatch samples (ms): 1 2 3 4 10 5 -> sorted 1 2 3 4 5 10: p50 rank 3 -> 3, p99 rank 6 -> 10.
  // Combine samples: 4 2 1 3 2 5 -> sorted 1 2 2 3 4 5: p50 2, p99 5.
  const Summary s = summary();
  EXPECT_NEAR(s.rows_wait_p50_ms, 3, within(3));
  EXPECT_DOUBLE_EQ(s.rows_wait_p99_ms, 10);
  EXPECT_NEAR(s.answers_wait_p50_ms, 2, within(2));
  EXPECT_DOUBLE_EQ(s.answers_wait_p99_ms, 5);
}

TEST_F(ReportTest, PhasesAreMeansPerMeasuredStep) {
  // route = total / 10: (10 + 20 + 40) / 3 ms.
  const Summary s = summary();
  EXPECT_NEAR(s.route_ms, 70.0 / 3, 1e-9);
  EXPECT_NEAR(s.experts_ms, 350.0 / 3, 1e-9);
}

TEST_F(ReportTest, ActivationRate) {
  // Pairs 400 + 400 + 300 = 1100 over 100 tokens x 3 steps x 2 layers x 4 experts.
  const Summary s = summary();
  EXPECT_NEAR(s.activation_rate, 1100.0 / 2400, 1e-12);
  EXPECT_NEAR(s.experts_per_token, 1100.0 / 600, 1e-12);
}

TEST_F(ReportTest, LoadSpreadOverTheWindowOnly) {
  // Window: steps 2 and 3. Layer 0: 10+30, 20+20, 30+10, 40+0 = 40 each: std 0, max/mean 1.
  // Layer 1: 0, 0, 0, 200: mean 50, std sqrt((3 x 50^2 + 150^2) / 4) = sqrt(7500):
  // std/mean sqrt(3), max/mean 4. Means over layers: sqrt(3) / 2 and 2.5.
  const Summary s = summary();
  EXPECT_NEAR(s.load_std_over_mean, std::sqrt(3.0) / 2, 1e-12);
  EXPECT_NEAR(s.load_max_over_mean, 2.5, 1e-12);
}

TEST_F(ReportTest, BytesSummedByClass) {
  const Summary s = summary();
  EXPECT_EQ(s.bytes[0], 111u);
  EXPECT_EQ(s.bytes[1], 222u);
  EXPECT_EQ(s.bytes[2], 333u);
}

TEST_F(ReportTest, JsonHasTheGoldenSignals) {
  summary();
  const nlohmann::json j = report.to_json();
  ASSERT_TRUE(j.contains("tokens_per_s"));
  EXPECT_NEAR(j["tokens_per_s"].get<double>(), 300 / 0.7, 1e-9);
  EXPECT_NEAR(j.at("step_latency_ms").at("p50").get<double>(), 200, within(200));
  EXPECT_NEAR(j.at("step_latency_ms").at("p99").get<double>(), 400, 1e-6);
  EXPECT_NEAR(j.at("rows_wait_ms").at("p50").get<double>(), 3, within(3));
  EXPECT_DOUBLE_EQ(j.at("rows_wait_ms").at("p99").get<double>(), 10);
  EXPECT_NEAR(j.at("answers_wait_ms").at("p50").get<double>(), 2, within(2));
  EXPECT_DOUBLE_EQ(j.at("answers_wait_ms").at("p99").get<double>(), 5);
  EXPECT_NEAR(j.at("activation_rate").get<double>(), 1100.0 / 2400, 1e-12);
  EXPECT_NEAR(j.at("expert_load_std_over_mean").get<double>(), std::sqrt(3.0) / 2, 1e-12);
  EXPECT_EQ(j.at("bytes_sent").at("same_rank").get<std::uint64_t>(), 111u);
  EXPECT_EQ(j.at("bytes_sent").at("same_island").get<std::uint64_t>(), 222u);
  EXPECT_EQ(j.at("bytes_sent").at("cross_island").get<std::uint64_t>(), 333u);
  EXPECT_EQ(j.at("measured_steps").get<std::uint64_t>(), 3u);
}

TEST_F(ReportTest, PrintNamesTheFigures) {
  summary();
  std::ostringstream os;
  report.print(os);
  const std::string text = os.str();
  EXPECT_NE(text.find("tokens/s           429"), std::string::npos) << text;
  EXPECT_NE(text.find("p50 199.74 ms   p99 400.00 ms  (wall time)"), std::string::npos) << text;
  EXPECT_NE(text.find("wait for rows      p50 2.99 ms   p99 10.00 ms  (per layer, idle while rows travel)"),
            std::string::npos)
      << text;
}

TEST_F(ReportTest, HealthyRunHasNoNonFiniteTerms) {
  const Summary s = summary();
  EXPECT_EQ(s.nonfinite, 0u);
  EXPECT_TRUE(s.nonfinite_by_expert.empty());
  EXPECT_EQ(report.to_json().at("nonfinite_terms").get<std::uint64_t>(), 0u);
  EXPECT_EQ(prometheus_text(s, ControlFigures{.epoch = 1}).find("moed_nonfinite"), std::string::npos);
  std::ostringstream os;
  report.print(os);
  EXPECT_EQ(os.str().find("NaN"), std::string::npos);
}

// NaN/inf terms count from the warm-up on, summed per (layer, expert) over steps.
TEST_F(ReportTest, PerLayerFiguresOverTheLoadWindow) {
  // Window: steps 2 and 3, 200 rows per layer. Layer 0: 40 per expert (160
  // pairs); layer 1: 0, 0, 0, 200.
  const Summary s = summary();
  ASSERT_EQ(s.layers.size(), 2u);
  const Summary::Layer& l0 = s.layers[0];
  const Summary::Layer& l1 = s.layers[1];
  EXPECT_NEAR(l0.activation_rate, 160.0 / 200 / 4, 1e-12);
  EXPECT_NEAR(l1.activation_rate, 200.0 / 200 / 4, 1e-12);
  EXPECT_NEAR(l0.load_std_over_mean, 0, 1e-12);
  EXPECT_NEAR(l1.load_std_over_mean, std::sqrt(3.0), 1e-12);
  EXPECT_NEAR(l1.load_max_over_mean, 4, 1e-12);
  // Hottest first, ties to the lower id.
  ASSERT_EQ(l0.hot.size(), 3u);
  EXPECT_EQ(l0.hot[0].expert, 0);
  EXPECT_EQ(l0.hot[2].expert, 2);
  EXPECT_DOUBLE_EQ(l0.hot[0].over_mean, 1);
  EXPECT_EQ(l1.hot[0].expert, 3);
  EXPECT_DOUBLE_EQ(l1.hot[0].over_mean, 4);
  EXPECT_EQ(l1.hot[1].expert, 0);
  EXPECT_DOUBLE_EQ(l1.hot[1].over_mean, 0);
  // Buckets 0.25 0.5 1 1.5 2 3 4, cumulative.
  EXPECT_EQ(l0.at_or_below, (std::array<std::uint64_t, 7>{0, 0, 4, 4, 4, 4, 4}));
  EXPECT_EQ(l1.at_or_below, (std::array<std::uint64_t, 7>{3, 3, 3, 3, 3, 3, 4}));
  EXPECT_EQ(l1.experts, 4u);
}

TEST(Report, TheRecentWindowShowsASlowdownTheMeanSinceStartHides) {
  // 40 fast steps (10 ms), then 4 slow ones (40 ms); recent window of 4 steps.
  Report r(run_info(0), 2, 4);
  double clock = 0;
  for (std::uint64_t step = 0; step < 44; ++step) {
    const double wall = step < 40 ? 0.010 : 0.040;
    feed(r, clock, step, record(wall, {wall / 10, wall / 10}, {wall / 5, wall / 5}, {0, 0, 0},
                                std::vector<std::uint64_t>(8, 25), 200), wall);
  }
  r.boundary(clock);
  const Summary s = r.summary();
  EXPECT_NEAR(s.recent_tokens_per_s, 100 / 0.040, 1e-6);
  EXPECT_NEAR(s.tokens_per_s, 4400 / (40 * 0.010 + 4 * 0.040), 1e-6);  // barely moved
  EXPECT_NEAR(s.recent_step_p50_ms, 40, 1e-9);
  EXPECT_NEAR(s.recent_step_p99_ms, 40, 1e-9);
  EXPECT_NEAR(s.step_p50_ms, 10, within(10));
  EXPECT_NEAR(s.recent_rows_wait_p50_ms, 4, 1e-9);  // the last 4 steps' 8 per-layer samples
  EXPECT_NEAR(s.recent_answers_wait_p99_ms, 8, 1e-9);
  EXPECT_NEAR(s.answers_wait_p50_ms, 2, within(2));
  EXPECT_NEAR(s.tokens_served, 4400, 1e-9);
}

TEST(Report, RowsOfTheWrongLayerCountAreABug) {
  Report r(run_info(0), 2);
  StepRecord rec = record(1, {1, 1}, {1, 1}, {0, 0, 0}, std::vector<std::uint64_t>(8, 1), 8);
  rec.tokens_per_layer = {100};
  test::expect_error([&] { r.add_step(0, rec); }, ErrorKind::Internal, {"rows of 1 layers, the model has 2"});
}

TEST(Report, NonFiniteTermsPerExpertInTextJsonAndPrometheus) {
  Report report(run_info(), 2);
  StepRecord warm = record(1, {0, 0}, {0, 0}, {0, 0, 0}, std::vector<std::uint64_t>(8, 1), 8);
  warm.nonfinite = {{1 * 4 + 3, 16}};  // layer 1 expert 3
  StepRecord later = warm;
  later.nonfinite = {{1 * 4 + 3, 32}, {0 * 4 + 2, 5}};
  double clock = 0;
  feed(report, clock, 0, warm, 1);
  feed(report, clock, 1, later, 1);
  report.boundary(clock);
  const Summary s = report.summary();
  EXPECT_EQ(s.nonfinite, 53u);
  ASSERT_EQ(s.nonfinite_by_expert.size(), 2u);
  EXPECT_EQ(s.nonfinite_by_expert[0].layer, 0);
  EXPECT_EQ(s.nonfinite_by_expert[0].expert, 2);
  EXPECT_EQ(s.nonfinite_by_expert[0].terms, 5u);
  EXPECT_EQ(s.nonfinite_by_expert[1].layer, 1);
  EXPECT_EQ(s.nonfinite_by_expert[1].expert, 3);
  EXPECT_EQ(s.nonfinite_by_expert[1].terms, 48u);

  std::ostringstream os;
  report.print(os);
  EXPECT_NE(os.str().find("WARNING            53 expert output terms were NaN or inf, so those tokens' outputs carry "
                          "NaN (layer 0 expert 2: 5; layer 1 expert 3: 48)"),
            std::string::npos)
      << os.str();
  const nlohmann::json j = report.to_json();
  EXPECT_EQ(j.at("nonfinite_terms").get<std::uint64_t>(), 53u);
  EXPECT_EQ(j.at("nonfinite_by_expert"),
            nlohmann::json::parse(R"([{"layer":0,"expert":2,"terms":5},{"layer":1,"expert":3,"terms":48}])"));
  const std::string metrics = prometheus_text(s, ControlFigures{.epoch = 1});
  EXPECT_NE(metrics.find("# TYPE moed_nonfinite_terms_total counter\n"
                         "moed_nonfinite_terms_total{layer=\"0\",expert=\"2\"} 5\n"
                         "moed_nonfinite_terms_total{layer=\"1\",expert=\"3\"} 48\n"),
            std::string::npos)
      << metrics;

  StepRecord wrong = later;
  wrong.nonfinite = {{8, 1}};  // beyond 2 layers x 4 experts
  test::expect_error([&] { report.add_step(2, wrong); }, ErrorKind::Internal, {"expert key 8"});
}

TEST_F(ReportTest, WallTimeNotEngineTimeMakesTokensPerSecond) {
  // Step 4 spends 0.1 s in its engine but 0.9 s from boundary to boundary.
  add(4, 0.9, record(0.1, {0.001, 0.001}, {0.001, 0.001}, {0, 0, 0}, {1, 1, 1, 1, 1, 1, 1, 1}, 8));
  const Summary s = summary();
  EXPECT_NEAR(s.tokens_per_s, 400 / 1.6, 1e-9);
  EXPECT_NEAR(s.step_p99_ms, 900, 1e-6);
  EXPECT_NEAR(s.engine_ms, (100 + 200 + 400 + 100) / 4.0, 1e-9);
}

TEST(Report, AStepWithoutItsClosingBoundaryHasNoWallTimeYet) {
  Report r(run_info(0), 4);
  r.boundary(10);
  r.add_step(0, record(0.5, {1}, {1}, {0, 0, 0}, std::vector<std::uint64_t>(8, 1), 8));
  EXPECT_EQ(r.summary().tokens_per_s, 0.0);  // still open
  r.boundary(11);
  EXPECT_NEAR(r.summary().tokens_per_s, 100.0, 1e-9);
  EXPECT_DOUBLE_EQ(r.summary().step_p50_ms, 1000);
}

TEST(Report, WindowLongerThanTheRunCoversEveryMeasuredStep) {
  Report r(run_info(0), 100);
  r.add_step(0, record(1, {1}, {1}, {0, 0, 0}, {4, 0, 0, 0, 1, 1, 1, 1}, 8));
  r.add_step(1, record(1, {1}, {1}, {0, 0, 0}, {0, 4, 0, 0, 1, 1, 1, 1}, 8));
  // Layer 0: 4, 4, 0, 0: mean 2, std 2 -> 1. Layer 1: 2 each -> 0.
  EXPECT_NEAR(r.summary().load_std_over_mean, 0.5, 1e-12);
  EXPECT_EQ(r.summary().measured_steps, 2u);
}

TEST(Report, TheLoadWindowSlidesOverManySteps) {
  // Window of 3 steps over 1000: only the last three loads count, whatever came before.
  Report r(run_info(0), 3);
  for (std::uint64_t step = 0; step < 1000; ++step) {
    std::vector<std::uint64_t> load(8, 0);
    load[step % 4] = 4 + step;  // layer 0: one expert per step
    load[4] = load[5] = load[6] = load[7] = 1;
    r.add_step(step, record(1, {1, 1}, {1, 1}, {0, 0, 0}, load, 8));
  }
  // Steps 997, 998, 999 load experts 1, 2, 3 of layer 0 with 1001, 1002, 1003; expert 0 has 0.
  std::vector<double> layer0{0, 1001, 1002, 1003};
  EXPECT_NEAR(r.summary().load_std_over_mean, std_over_mean(layer0) / 2, 1e-12);
  EXPECT_NEAR(r.summary().load_max_over_mean, (max_over_mean(layer0) + 1) / 2, 1e-12);
  EXPECT_EQ(r.summary().measured_steps, 1000u);
}

TEST(Report, MemoryDoesNotGrowWithSteps) {
  // A daemon serves for months: the report after 100,000 steps holds what it
  // held after a few. Measured on the heap.
  Report r(run_info(0), 4);
  auto feed = [&](std::uint64_t from, std::uint64_t to) {
    for (std::uint64_t step = from; step < to; ++step)
      r.add_step(step, record(0.001 * double(1 + step % 7), {0.001, 0.002}, {0.003, 0.001}, {1, 1, 1},
                              std::vector<std::uint64_t>(8, step % 5), 8));
  };
  feed(0, 100);
  const std::size_t early = test::heap_in_use();
  const std::size_t retained = r.retained_samples();
  feed(100, 100000);
  // Keeping even 100 bytes a step would show as 10 MB; allow allocator noise.
  EXPECT_LE(test::heap_in_use(), early + 64 * 1024) << "the report keeps something per step";
  EXPECT_EQ(r.summary().measured_steps, 100000u);
  EXPECT_EQ(r.retained_samples(), retained) << "the windows were full after 100 steps";
  EXPECT_EQ(r.to_json().at("retained_samples").get<std::size_t>(), retained);
}

TEST(Report, RetainedSamplesFillTheWindowsThenStop) {
  // A load window of 4 steps and recent windows of 32 (steps, and waits of
  // each of the 2 layers).
  Report r(run_info(0), 4);
  auto step = [&](std::uint64_t s) {
    r.boundary(double(s));
    r.add_step(s, record(0.001, {0.001, 0.002}, {0.003, 0.001}, {1, 1, 1}, std::vector<std::uint64_t>(8, 1), 8));
  };
  EXPECT_EQ(r.retained_samples(), 0u);
  step(0);
  // The load window's step (loads and rows) and one wait per layer and kind;
  // the wall time of a step is closed by the next boundary.
  EXPECT_EQ(r.retained_samples(), 2u + 2u * 2u);
  for (std::uint64_t s = 1; s < 1000; ++s) step(s);
  EXPECT_EQ(r.retained_samples(), 2u * 4u + 2u * 32u + 2u * 2u * 32u);
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
