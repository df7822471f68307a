// The published snapshot: what status, the metrics text and the dashboard
// show after a publish, the alerts it evaluates and adds, and the heatmap
// kept only where the endpoint serves it.
#include "runtime/observe/snapshot.h"

#include <gtest/gtest.h>

#include <string>

namespace moed::runtime {
namespace {

Config config_with_endpoint() {
  Config c = default_config();
  c.metrics.listen = "127.0.0.1:0";
  c.metrics.heatmap_columns = 4;
  c.metrics.heatmap_column_steps = 1;
  return c;
}

ControlState serving(std::uint64_t step) {
  ControlState s;
  s.step = step;
  s.state = "serving";
  s.now = 100;
  s.figures.epoch = 3;
  return s;
}

// A summary whose load spread is over any limit of 1.
Summary skewed_summary() {
  Summary s;
  s.measured_steps = 1;
  s.tokens_per_s = 1234;
  s.load_std_over_mean = 5;
  return s;
}

bool has_line(const std::string& text, const std::string& line) {
  return ("\n" + text).find("\n" + line + "\n") != std::string::npos;
}

TEST(Snapshot, NothingIsShownBeforeTheFirstPublish) {
  const Snapshot snapshot(default_config(), 2, {0, 0, 1, 1});
  EXPECT_TRUE(snapshot.status().is_null());
  EXPECT_FALSE(snapshot.metrics_text());
  EXPECT_TRUE(snapshot.migration().is_null());
  EXPECT_FALSE(snapshot.last_stats());
  EXPECT_EQ(snapshot.rank(), 2);
  EXPECT_EQ(snapshot.island_of_rank(), (std::vector<int>{0, 0, 1, 1}));
  EXPECT_FALSE(snapshot.dashboard_view().summary);
}

// The front door's idle turns: counted as they happen, shown in status (read
// at once, not at the next publish); a built-in workload has none to show.
TEST(Snapshot, StatusCountsTheFrontDoorsIdleTurns) {
  Config with_front_door = default_config();
  with_front_door.workload.kind = WorkloadKind::ingress;
  Snapshot snapshot(with_front_door, 0, {0});
  snapshot.note_idle_turn();
  EXPECT_TRUE(snapshot.status().is_null());  // nothing before the first publish
  snapshot.publish(serving(1), nullptr);
  EXPECT_EQ(snapshot.status()["idle_turns"], 1u);
  for (int i = 0; i < 41; ++i) snapshot.note_idle_turn();
  EXPECT_EQ(snapshot.status()["idle_turns"], 42u);
  EXPECT_EQ(snapshot.status()["step"], 1u);

  Snapshot built_in(default_config(), 0, {0});
  built_in.publish(serving(1), nullptr);
  EXPECT_FALSE(built_in.status().contains("idle_turns"));
}

TEST(Snapshot, APublishWithoutFiguresShowsStatusOnly) {
  Snapshot snapshot(default_config(), 1, {0, 1});
  ControlState control = serving(7);
  control.state = "draining";
  snapshot.publish(control, nullptr);
  const nlohmann::json status = snapshot.status();
  EXPECT_EQ(status["rank"], 1);
  EXPECT_EQ(status["epoch"], 3);
  EXPECT_EQ(status["step"], 7);
  EXPECT_EQ(status["state"], "draining");
  EXPECT_TRUE(status["migration"].is_null());
  EXPECT_EQ(status["alerts"], nlohmann::json::array());
  EXPECT_TRUE(status["memory"].is_null());  // before note_loaded
  EXPECT_FALSE(status.contains("tokens_per_s"));
  EXPECT_FALSE(snapshot.metrics_text());
}

TEST(Snapshot, FiguresBringTheAlertsAndTheMetricsText) {
  Config c = default_config();
  c.metrics.alert_load_std_over_mean = 1;
  c.metrics.alert_activation_band = c.metrics.alert_alltoall_p99_ms = c.metrics.alert_step_p99_ms = 0;
  c.metrics.alert_for_s = 0;
  Snapshot snapshot(c, 0, {0});
  ControlState control = serving(9);
  control.stats_file_alert = "the statistics file cannot be written";
  control.migration = {{"id", 4}};
  const Summary summary = skewed_summary();
  snapshot.publish(control, &summary);
  const nlohmann::json status = snapshot.status();
  EXPECT_EQ(status["tokens_per_s"], 1234);
  ASSERT_EQ(status["alerts"].size(), 2u);  // the load spread's, then the file's
  EXPECT_NE(status["alerts"][0].get<std::string>().find("load"), std::string::npos) << status["alerts"][0];
  EXPECT_EQ(status["alerts"][1], "the statistics file cannot be written");
  EXPECT_EQ(snapshot.migration(), control.migration);
  const std::optional<std::string> text = snapshot.metrics_text();
  ASSERT_TRUE(text);
  EXPECT_TRUE(has_line(*text, "moed_alerts 2")) << *text;
  EXPECT_TRUE(has_line(*text, "moed_alert_firing{alert=\"load_spread\"} 1")) << *text;
  EXPECT_TRUE(has_line(*text, "moed_alert_firing{alert=\"stats_file\"} 1")) << *text;
  EXPECT_TRUE(has_line(*text, "moed_alert_threshold{alert=\"load_spread\"} 1")) << *text;
  EXPECT_TRUE(has_line(*text, "moed_placement_epoch 3")) << *text;
  const Snapshot::DashboardView view = snapshot.dashboard_view();
  ASSERT_TRUE(view.summary);
  EXPECT_EQ(view.summary->tokens_per_s, 1234);
  EXPECT_EQ(view.thresholds.load_std_over_mean, 1);
  EXPECT_EQ(view.status, status);
}

TEST(Snapshot, APublishWithoutFiguresKeepsTheLastMetrics) {
  Snapshot snapshot(default_config(), 0, {0});
  const Summary summary = skewed_summary();
  snapshot.publish(serving(1), &summary);
  snapshot.publish(serving(2), nullptr);
  EXPECT_TRUE(snapshot.metrics_text());
  EXPECT_EQ(snapshot.status()["step"], 2);
  EXPECT_FALSE(snapshot.status().contains("tokens_per_s"));
}

TEST(Snapshot, DecisionsShowAtOnce) {
  Snapshot snapshot(default_config(), 0, {0});
  snapshot.set_placement({{"epoch", 5}});
  snapshot.set_migration({{"id", 1}});
  auto stats = std::make_shared<const routing::RoutingStats>(2, 4, 0.0, 8, 2);
  snapshot.set_stats(stats);
  EXPECT_EQ(snapshot.placement()["epoch"], 5);
  EXPECT_EQ(snapshot.dashboard_view().placement["epoch"], 5);
  EXPECT_EQ(snapshot.migration()["id"], 1);
  EXPECT_EQ(snapshot.last_stats(), stats);  // shared, not copied
}

// An idle daemon publishes no step: status shows a migration's end at once
// all the same (a migration ended by a lost rank, or by an idle turn).
TEST(Snapshot, StatusShowsTheMigrationAsSetWithoutAStep) {
  Snapshot snapshot(default_config(), 0, {0});
  ControlState control = serving(7);
  control.migration = {{"id", 1}, {"state", "transfer"}};
  snapshot.publish(control, nullptr);
  snapshot.set_migration({{"id", 1}, {"state", "aborted"}});
  EXPECT_EQ(snapshot.status()["migration"]["state"], "aborted");
  EXPECT_EQ(snapshot.status()["step"], 7);
}

TEST(Snapshot, TheHeatmapIsKeptOnRankZeroWithTheEndpoint) {
  const Config c = config_with_endpoint();
  const std::vector<std::uint64_t> loads(std::size_t(c.model.layers * c.model.experts), 2);
  Snapshot rank0(c, 0, {0, 0}), rank1(c, 1, {0, 0}), no_endpoint(default_config(), 0, {0, 0});
  for (Snapshot* s : {&rank0, &rank1, &no_endpoint}) s->record_loads(loads);
  ASSERT_EQ(rank0.heatmap_layer(0).size(), 1u);
  EXPECT_EQ(rank0.heatmap_layer(0)[0].load, std::vector<std::uint64_t>(std::size_t(c.model.experts), 2));
  EXPECT_EQ(rank0.heatmap_column_steps(), 1);
  EXPECT_TRUE(rank1.heatmap_layer(0).empty());
  EXPECT_TRUE(no_endpoint.heatmap_layer(0).empty());
}

// Elastic serving: a rank that becomes the survivors' rank 0 keeps the
// heatmap from then on (its endpoint opens then); without an endpoint, none.
TEST(Snapshot, ARankThatBecomesRankZeroKeepsTheHeatmapFromThenOn) {
  const Config c = config_with_endpoint();
  const std::vector<std::uint64_t> loads(std::size_t(c.model.layers * c.model.experts), 3);
  Snapshot rank1(c, 1, {0, 0}), no_endpoint(default_config(), 1, {0, 0});
  rank1.record_loads(loads);
  rank1.keep_heatmap(c);
  no_endpoint.keep_heatmap(default_config());
  EXPECT_TRUE(rank1.heatmap_layer(0).empty()) << "steps before it became rank 0 are not kept";
  rank1.record_loads(loads);
  no_endpoint.record_loads(loads);
  ASSERT_EQ(rank1.heatmap_layer(0).size(), 1u);
  EXPECT_EQ(rank1.heatmap_layer(0)[0].load, std::vector<std::uint64_t>(std::size_t(c.model.experts), 3));
  EXPECT_TRUE(no_endpoint.heatmap_layer(0).empty());
}

// A rank that joined (a spare, or `moed --join`) has served no step when
// it learns its epoch: status shows the survivors at once, not "starting".
TEST(Snapshot, ARankThatJoinedShowsItsEpochBeforeItsFirstStep) {
  Snapshot joined(default_config(), 4, {0, 0});
  EXPECT_TRUE(joined.status().is_null());
  joined.set_survivors({{"epoch", 2}, {"members", {0, 1, 2, 3, 4}}});
  const nlohmann::json status = joined.status();
  EXPECT_EQ(status.value("rank", -1), 4);
  EXPECT_EQ(status.value("state", ""), "serving");
  EXPECT_EQ(status["survivors"]["epoch"], 2);
}

}  // namespace
}  // namespace moed::runtime
