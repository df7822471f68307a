// The Prometheus exposition: well formed, and its series bounded by the
// model's shape whatever the traffic.
#include "runtime/observe/prometheus_text.h"

#include <gtest/gtest.h>

#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

namespace moed::runtime {
namespace {

RunInfo info(int layers, int experts) {
  RunInfo i;
  i.shape = ModelShape{layers, experts, 2, 16, 32, {}};
  i.warmup_steps = 0;
  return i;
}

// `steps` steps of the given traffic: skewed puts most pairs on expert 0.
Summary run(int layers, int experts, int hot_experts, int steps, bool skewed) {
  Report r(info(layers, experts), 8, 16, hot_experts);
  double clock = 0;
  for (int step = 0; step < steps; ++step) {
    StepRecord rec;
    rec.total = 0.01;
    rec.rows_wait_per_layer.assign(std::size_t(layers), 0.001 * (1 + step % 3));
    rec.answers_wait_per_layer.assign(std::size_t(layers), 0.002);
    rec.expert_load.assign(std::size_t(layers * experts), skewed ? 1 : 50);
    for (int l = 0; l < layers && skewed; ++l) rec.expert_load[std::size_t(l * experts)] = 100 * experts;
    rec.tokens_per_layer.assign(std::size_t(layers), 64);
    rec.token_layers = 64 * std::uint64_t(layers);
    rec.bytes_sent = {1, 2, 3};
    r.boundary(clock);
    r.add_step(std::uint64_t(step), rec);
    clock += 0.01;
  }
  r.boundary(clock);
  return r.summary();
}

struct Exposition {
  std::vector<std::string> series;  // "name{labels}" of each sample
  std::set<std::string> typed;      // names with a TYPE line
  std::map<std::string, std::string> values;
};

Exposition parse(const std::string& text) {
  Exposition e;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("# TYPE ", 0) == 0) {
      e.typed.insert(line.substr(7, line.find(' ', 7) - 7));
      continue;
    }
    if (line.empty() || line[0] == '#') continue;
    const std::size_t space = line.rfind(' ');
    e.series.push_back(line.substr(0, space));
    e.values[line.substr(0, space)] = line.substr(space + 1);
  }
  return e;
}

// Per the list in docs/metrics.md: 48 series for the job, and per layer 11
// (activation, spread, max/mean, 8 buckets) plus 2 per hot expert.
std::size_t expected_series(int layers, int hot_experts) {
  return 48 + std::size_t(layers) * (11 + 2 * std::size_t(hot_experts));
}

struct Shape {
  int layers, experts, hot;
};
class Cardinality : public ::testing::TestWithParam<Shape> {};

TEST_P(Cardinality, BoundedByTheShapeNotTheTraffic) {
  const auto [L, E, N] = GetParam();
  const std::size_t want = expected_series(L, std::min(N, E));
  for (int steps : {1, 300})
    for (bool skewed : {false, true}) {
      const Exposition e = parse(prometheus_text(run(L, E, N, steps, skewed), ControlFigures{}));
      EXPECT_EQ(e.series.size(), want) << steps << " steps, skewed " << skewed;
      EXPECT_EQ(std::set<std::string>(e.series.begin(), e.series.end()).size(), e.series.size()) << "a duplicate series";
      for (const auto& [series, value] : e.values) {
        EXPECT_TRUE(e.typed.count(series.substr(0, series.find('{')))) << series << " has no TYPE";
        EXPECT_EQ(value.find("nan"), std::string::npos) << series;
      }
    }
}

INSTANTIATE_TEST_SUITE_P(Shapes, Cardinality,
                         ::testing::Values(Shape{2, 4, 3}, Shape{5, 64, 3}, Shape{3, 256, 8}, Shape{1, 2, 3},
                                           Shape{4, 8, 0}));

TEST(PrometheusText, GoldenSignalsAndControlFigures) {
  ControlFigures c;
  c.epoch = 2;
  c.alerts = 1;
  c.migration_state = "transfer";
  c.migration_bytes = 400, c.migration_done_bytes = 100;
  c.firing[std::size_t(AlertKind::load_spread)] = true;
  c.thresholds = {.load_std_over_mean = 0.15, .activation_band = 0.5, .expected_activation = 0.25, .for_s = 30};
  const Exposition e = parse(prometheus_text(run(2, 4, 3, 10, true), c));
  const auto value = [&](const std::string& series) {
    const auto it = e.values.find(series);
    return it == e.values.end() ? std::string("(none)") : it->second;
  };
  EXPECT_EQ(value("moed_hot_expert{layer=\"1\",position=\"1\"}"), "0");  // expert 0 carries the skew
  EXPECT_EQ(value("moed_hot_expert{layer=\"1\",position=\"2\"}"), "1");
  EXPECT_EQ(value("moed_expert_load_over_mean_bucket{layer=\"0\",le=\"0.25\"}"), "3");
  EXPECT_EQ(value("moed_expert_load_over_mean_bucket{layer=\"0\",le=\"+Inf\"}"), "4");
  EXPECT_EQ(value("moed_migration_state{state=\"transfer\"}"), "1");
  EXPECT_EQ(value("moed_migration_state{state=\"none\"}"), "0");
  EXPECT_EQ(value("moed_migration_progress"), "0.25");
  EXPECT_EQ(value("moed_alert_firing{alert=\"load_spread\"}"), "1");
  EXPECT_EQ(value("moed_alert_firing{alert=\"step_p99\"}"), "0");
  EXPECT_EQ(value("moed_alert_threshold{alert=\"load_spread\"}"), "0.15");
  EXPECT_EQ(value("moed_alert_threshold{alert=\"activation_rate_low\"}"), "0.125");
  EXPECT_EQ(value("moed_alert_threshold{alert=\"activation_rate_high\"}"), "0.375");
  EXPECT_EQ(value("moed_alert_threshold{alert=\"alltoall_p99\"}"), "0");
  EXPECT_EQ(value("moed_steps_total"), "10");
  EXPECT_EQ(value("moed_tokens_total"), "640");
  EXPECT_EQ(value("moed_bytes_sent_total{link=\"cross_island\"}"), "30");
  EXPECT_NEAR(std::stod(value("moed_recent_tokens_per_second")), 6400, 1e-6);  // 640 tokens over 10 x 0.01 s
}

// The dashboard's per-rank signals: 3 series per rank, none without per-rank figures.
TEST(PrometheusText, PerRankSeriesBoundedByTheRanks) {
  Summary s = run(2, 4, 3, 3, true);
  const std::size_t without = parse(prometheus_text(s, ControlFigures{})).series.size();
  s.ranks = {{0.25, 0.5, 3.0, true}, {0.25, 0.75, 4.5, true}, {0.0, 0.0, 1.0, false}};
  const Exposition e = parse(prometheus_text(s, ControlFigures{}));
  EXPECT_EQ(e.series.size(), without + 3 * 3);
  EXPECT_EQ(e.values.at("moed_rank_expert_load_std_over_mean{rank=\"1\"}"), "0.75");
  EXPECT_EQ(e.values.at("moed_rank_recent_alltoall_wait_p99_ms{rank=\"2\"}"), "1");
  EXPECT_EQ(e.values.at("moed_rank_activation_rate{rank=\"0\"}"), "0.25");
  for (const char* name : {"moed_rank_activation_rate", "moed_rank_expert_load_std_over_mean",
                           "moed_rank_recent_alltoall_wait_p99_ms"})
    EXPECT_TRUE(e.typed.count(name)) << name;
}

}  // namespace
}  // namespace moed::runtime
