// The [metrics] alerts: each band, the time a condition must hold, and the
// texts naming cause and action.
#include "runtime/observe/alerts.h"

#include <gtest/gtest.h>

#include <string>

namespace moed::runtime {
namespace {

AlertThresholds limits() {
  AlertThresholds t;
  t.load_std_over_mean = 0.15;
  t.activation_band = 0.25;
  t.expected_activation = 0.25;  // top-2 of 8
  t.alltoall_p99_ms = 20;
  t.step_p99_ms = 100;
  t.for_s = 30;
  return t;
}

AlertSignals healthy() {
  AlertSignals s;
  s.load_std_over_mean = 0.10;
  s.layer_activation = {0.25, 0.25, 0.25};
  s.rows_wait_p99_ms = 5, s.answers_wait_p99_ms = 8;
  s.step_p99_ms = 50;
  return s;
}

TEST(Alerts, HealthySignalsBreachNothing) {
  for (int k = 0; k < kAlertKinds; ++k)
    EXPECT_FALSE(check_alert(AlertKind(k), healthy(), limits())) << alert_name(AlertKind(k));
}

struct BandCase {
  const char* name;
  AlertKind kind;
  void (*change)(AlertSignals&);
  bool breach;
  Breach want;
};

class AlertBands : public ::testing::TestWithParam<BandCase> {};

TEST_P(AlertBands, BreachOrNot) {
  AlertSignals s = healthy();
  GetParam().change(s);
  const std::optional<Breach> b = check_alert(GetParam().kind, s, limits());
  ASSERT_EQ(b.has_value(), GetParam().breach);
  if (b) {
    EXPECT_DOUBLE_EQ(b->value, GetParam().want.value);
    EXPECT_DOUBLE_EQ(b->limit, GetParam().want.limit);
    EXPECT_EQ(b->where, GetParam().want.where);
  }
}

INSTANTIATE_TEST_SUITE_P(
    Golden, AlertBands,
    ::testing::Values(
        BandCase{"spread_over", AlertKind::load_spread, [](AlertSignals& s) { s.load_std_over_mean = 0.42; }, true,
                 {0.42, 0.15, ""}},
        BandCase{"spread_at_limit", AlertKind::load_spread, [](AlertSignals& s) { s.load_std_over_mean = 0.15; },
                 false, {}},
        // Band 0.25 around 0.25: [0.1875, 0.3125].
        BandCase{"activation_inside", AlertKind::activation_rate,
                 [](AlertSignals& s) { s.layer_activation = {0.19, 0.31, 0.25}; }, false, {}},
        BandCase{"activation_low", AlertKind::activation_rate,
                 [](AlertSignals& s) { s.layer_activation = {0.25, 0.125, 0.25}; }, true, {0.125, 0.1875, "layer 1"}},
        BandCase{"activation_worst_layer", AlertKind::activation_rate,
                 [](AlertSignals& s) { s.layer_activation = {0.35, 0.25, 0.5}; }, true, {0.5, 0.3125, "layer 2"}},
        BandCase{"dispatch_slow", AlertKind::alltoall_p99,
                 [](AlertSignals& s) { s.rows_wait_p99_ms = 31; }, true, {31, 20, "dispatch"}},
        BandCase{"combine_slower", AlertKind::alltoall_p99,
                 [](AlertSignals& s) { s.rows_wait_p99_ms = 25, s.answers_wait_p99_ms = 40; }, true,
                 {40, 20, "combine"}},
        BandCase{"step_slow", AlertKind::step_p99, [](AlertSignals& s) { s.step_p99_ms = 150; }, true,
                 {150, 100, ""}}),
    [](const auto& info) { return std::string(info.param.name); });

TEST(Alerts, ZeroThresholdMeansNever) {
  AlertSignals s = healthy();
  s.load_std_over_mean = 50, s.layer_activation = {1.0}, s.rows_wait_p99_ms = 1e6, s.step_p99_ms = 1e6;
  const AlertThresholds off{.expected_activation = 0.25};
  for (int k = 0; k < kAlertKinds; ++k) EXPECT_FALSE(check_alert(AlertKind(k), s, off)) << alert_name(AlertKind(k));
}

TEST(Alerts, FiresOnlyAfterHoldingForTheConfiguredTime) {
  AlertBook book(limits());
  AlertSignals skewed = healthy();
  skewed.load_std_over_mean = 0.42;
  EXPECT_TRUE(book.update(skewed, 100).empty());  // pending since 100
  EXPECT_TRUE(book.update(skewed, 129).empty());
  EXPECT_FALSE(book.firing(AlertKind::load_spread));
  const std::vector<std::string> texts = book.update(skewed, 130);
  ASSERT_EQ(texts.size(), 1u);
  EXPECT_TRUE(book.firing(AlertKind::load_spread));
  EXPECT_EQ(texts[0].rfind("expert load std/mean 0.42 > 0.15 for 30 s: ", 0), 0u) << texts[0];
  EXPECT_NE(texts[0].find("moectl reoptimize --apply"), std::string::npos);
}

TEST(Alerts, ABreakRestartsTheClockAndClearsAtOnce) {
  AlertBook book(limits());
  AlertSignals slow = healthy();
  slow.step_p99_ms = 200;
  book.update(slow, 0);
  book.update(healthy(), 20);  // the condition cleared: the clock restarts
  EXPECT_TRUE(book.update(slow, 40).empty());
  EXPECT_TRUE(book.update(slow, 69).empty());
  EXPECT_EQ(book.update(slow, 70).size(), 1u);
  EXPECT_TRUE(book.update(healthy(), 71).empty());
  EXPECT_FALSE(book.firing(AlertKind::step_p99));
}

TEST(Alerts, ZeroHoldFiresAtOnceInKindOrder) {
  AlertThresholds t = limits();
  t.for_s = 0;
  AlertBook book(t);
  AlertSignals bad = healthy();
  bad.load_std_over_mean = 0.5, bad.step_p99_ms = 500, bad.answers_wait_p99_ms = 60;
  const std::vector<std::string> texts = book.update(bad, 5);
  ASSERT_EQ(texts.size(), 3u);
  EXPECT_EQ(texts[0].rfind("expert load std/mean", 0), 0u);
  EXPECT_EQ(texts[1].rfind("all-to-all combine wait p99 60.0 ms > 20.0 ms for 0 s", 0), 0u) << texts[1];
  EXPECT_EQ(texts[2].rfind("step p99 500.0 ms > 100.0 ms", 0), 0u);
}

TEST(Alerts, EveryTextNamesAnAction) {
  const Breach b{1, 0.5, "layer 3"};
  for (int k = 0; k < kAlertKinds; ++k) {
    const std::string text = alert_text(AlertKind(k), b, 12);
    EXPECT_NE(text.find("for 12 s: "), std::string::npos) << text;
    EXPECT_TRUE(text.find("moectl") != std::string::npos || text.find("[router]") != std::string::npos) << text;
  }
  EXPECT_EQ(alert_name(AlertKind::alltoall_p99), "alltoall_p99");
}

}  // namespace
}  // namespace moed::runtime
