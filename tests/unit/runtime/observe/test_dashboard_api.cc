// The dashboard's JSON endpoints and their query checks.
#include "runtime/observe/http/dashboard_api.h"

#include <gtest/gtest.h>

namespace moed::runtime::http {
namespace {

using nlohmann::json;

struct BandCase {
  double value, limit;
  Band want;
};
class BandBelow : public ::testing::TestWithParam<BandCase> {};
TEST_P(BandBelow, InsideNearOutOrOff) {
  EXPECT_EQ(band_below(GetParam().value, GetParam().limit), GetParam().want)
      << GetParam().value << " against " << GetParam().limit;
}
INSTANTIATE_TEST_SUITE_P(Cases, BandBelow,
                         ::testing::Values(BandCase{0.10, 0.15, Band::ok}, BandCase{0.12, 0.15, Band::ok},
                                           BandCase{0.13, 0.15, Band::near}, BandCase{0.15, 0.15, Band::near},
                                           BandCase{0.16, 0.15, Band::out}, BandCase{99, 0, Band::off}));

TEST(Bands, AroundACentreBothWays) {
  EXPECT_EQ(band_around(0.25, 0.25, 0.0625), Band::ok);
  EXPECT_EQ(band_around(0.31, 0.25, 0.0625), Band::near);
  EXPECT_EQ(band_around(0.19, 0.25, 0.0625), Band::near);
  EXPECT_EQ(band_around(0.125, 0.25, 0.0625), Band::out);
  EXPECT_EQ(band_around(0.40, 0.25, 0.0625), Band::out);
  EXPECT_EQ(band_around(0.0, 0.25, 0), Band::off);
  EXPECT_EQ(band_name(Band::near), "near");
}

struct QueryCase {
  Query query;
  int layers;
  int layer;            // when good
  std::string error;    // a part of the message; empty: good
};
class LayerQuery : public ::testing::TestWithParam<QueryCase> {};
TEST_P(LayerQuery, GoodOrNamed) {
  const QueryCase& c = GetParam();
  std::string error = check_query(c.query, {"layer"}).value_or("");
  LayerOrError parsed{};
  if (error.empty()) parsed = query_layer(c.query, c.layers), error = parsed.error;
  if (c.error.empty()) {
    EXPECT_EQ(error, "");
    EXPECT_EQ(parsed.layer, c.layer);
  } else {
    EXPECT_NE(error.find(c.error), std::string::npos) << error;
  }
}
INSTANTIATE_TEST_SUITE_P(
    Cases, LayerQuery,
    ::testing::Values(QueryCase{{}, 3, 0, ""}, QueryCase{{{"layer", "2"}}, 3, 2, ""},
                      QueryCase{{{"layer", "3"}}, 3, 0, "layer = 3 is out of range: the model has 3 MoE layers (0 to 2)"},
                      QueryCase{{{"layer", "-1"}}, 3, 0, "out of range"},
                      QueryCase{{{"layer", "1x"}}, 3, 0, "layer = '1x' is not a layer number (0 to 2)"},
                      QueryCase{{{"layer", ""}}, 3, 0, "is not a layer number"},
                      QueryCase{{{"layer", "99999999999"}}, 3, 0, "is not a layer number"},
                      QueryCase{{{"layer", "1"}, {"layer", "2"}}, 3, 0, "parameter 'layer' given 2 times"},
                      QueryCase{{{"lyer", "1"}}, 3, 0, "unknown parameter 'lyer': this page takes layer"}));

// With dense layers the page takes the model's layer numbers: MoE layers 0-2 are model layers 1, 2 and 4.
TEST(LayerQueryByModelNumber, MapsToTheMoeLayerAndRefusesDenseOnes) {
  const LayerNumbers numbers({1, 2, 4});
  EXPECT_EQ(query_layer({}, 3, numbers).layer, 0);
  EXPECT_EQ(query_layer({{"layer", "4"}}, 3, numbers).layer, 2);
  EXPECT_EQ(query_layer({{"layer", "2"}}, 3, numbers).layer, 1);
  EXPECT_EQ(query_layer({{"layer", "3"}}, 3, numbers).error,
            "layer = 3 is a dense layer: the dashboard shows the MoE layers (1 to 4)");
  EXPECT_EQ(query_layer({{"layer", "0"}}, 3, numbers).error, "layer = 0 is out of range: the model has 3 MoE layers (1 to 4)");
  EXPECT_EQ(query_layer({{"layer", "x"}}, 3, numbers).error, "layer = 'x' is not a layer number (1 to 4)");
}

TEST(CheckQuery, APageWithoutParameters) {
  EXPECT_EQ(check_query({}, {}), std::nullopt);
  EXPECT_EQ(check_query({{"x", "1"}}, {}).value_or(""), "unknown parameter 'x': this page takes none");
  EXPECT_EQ(bad_request("why").status, 400);
  EXPECT_EQ(bad_request("why").body, "why\n");
}

Summary two_rank_summary() {
  Summary s;
  s.measured_steps = 7;
  s.activation_rate = 0.25;
  s.load_std_over_mean = 0.5;
  s.recent_rows_wait_p99_ms = 3;
  s.recent_answers_wait_p99_ms = 4;
  s.ranks = {{0.25, 0.10, 2.0, true}, {0.0, 0.0, 30.0, false}};
  return s;
}

TEST(HealthJson, JobAndRanksColouredByTheirBands) {
  const Summary s = two_rank_summary();
  AlertThresholds t{.load_std_over_mean = 0.15, .activation_band = 0.25, .expected_activation = 0.25,
                    .alltoall_p99_ms = 20};
  const json status = {{"step", 9}, {"epoch", 1}, {"state", "serving"}, {"alerts", {"a text"}}};
  const json h = health_json({&s, t, {0, 1}, status, nullptr});
  EXPECT_EQ(h["step"], 9);
  EXPECT_EQ(h["measured_steps"], 7);
  EXPECT_EQ(h["alerts"], json({"a text"}));
  EXPECT_DOUBLE_EQ(h["bands"]["activation_rate"]["halfwidth"].get<double>(), 0.0625);
  EXPECT_EQ(h["job"]["activation_rate"], json({{"value", 0.25}, {"band", "ok"}}));
  EXPECT_EQ(h["job"]["load_std_over_mean"]["band"], "out");
  EXPECT_EQ(h["job"]["alltoall_p99_ms"], json({{"value", 4.0}, {"band", "ok"}}));  // the slower phase
  ASSERT_EQ(h["ranks"].size(), 2u);
  EXPECT_EQ(h["ranks"][0]["island"], 0);
  EXPECT_EQ(h["ranks"][0]["load_std_over_mean"]["band"], "ok");
  EXPECT_EQ(h["ranks"][1]["island"], 1);
  EXPECT_EQ(h["ranks"][1]["activation_rate"]["band"], "idle");  // routed nothing in the window
  EXPECT_EQ(h["ranks"][1]["alltoall_p99_ms"]["band"], "out");
}

TEST(HealthJson, BeforeTheFirstMeasuredStep) {
  const json h = health_json({nullptr, AlertThresholds{}, {0}, json::object(), nullptr});
  EXPECT_EQ(h["job"], nullptr);
  EXPECT_TRUE(h["ranks"].empty());
  EXPECT_EQ(h["state"], "starting");
  EXPECT_EQ(h["bands"]["load_std_over_mean"]["limit"], 0.0);
}

TEST(HeatmapJson, ColumnsAndTheLayersFigures) {
  Summary::Layer f;
  f.activation_rate = 0.25, f.load_std_over_mean = 0.8, f.load_max_over_mean = 2.5;
  f.hot = {{3, 2.5}, {1, 1.2}};
  const json h = heatmap_json(1, 4, 8, {{0, 7, {1, 2, 3, 4}}, {8, 15, {0, 0, 9, 1}}}, &f);
  EXPECT_EQ(h["layer"], 1);
  EXPECT_EQ(h["experts"], 4);
  EXPECT_EQ(h["column_steps"], 8);
  ASSERT_EQ(h["columns"].size(), 2u);
  EXPECT_EQ(h["columns"][1], json({{"first_step", 8}, {"last_step", 15}, {"load", {0, 0, 9, 1}}}));
  EXPECT_EQ(h["figures"]["hot"][0], json({{"expert", 3}, {"over_mean", 2.5}}));
  EXPECT_EQ(heatmap_json(0, 4, 8, {}, nullptr)["figures"], nullptr);
}

TEST(CoactivationJson, SymmetricWithItsMaximum) {
  routing::RoutingStats stats(2, 3, 0);
  const std::uint32_t a[] = {0, 2}, b[] = {1, 2};
  stats.add_choice(1, a);
  stats.add_choice(1, a);
  stats.add_choice(1, b);
  stats.end_step();
  const json c = coactivation_json(stats, 1, 1);
  EXPECT_EQ(c["experts"], 3);
  EXPECT_EQ(c["steps"], 1);
  EXPECT_EQ(c["matrix"], json({{0.0, 0.0, 2.0}, {0.0, 0.0, 1.0}, {2.0, 1.0, 0.0}}));
  EXPECT_EQ(c["max"], 2.0);
}

TEST(PlacementJson, IslandsAndReplicatedExperts) {
  const json p = {{"epoch", 2}, {"ranks", 2}, {"layers", 2}, {"experts", 2},
                  {"slots", {{{0}, {0, 1}}, {{1}, {0}}}}};
  const json out = placement_with_islands(p, {0, 1});
  EXPECT_EQ(out["islands"], json({0, 1}));
  EXPECT_EQ(out["replicated"], json({{1}, json::array()}));
  EXPECT_EQ(out["epoch"], 2);
  // A split expert's ranks hold shards: not replicated.
  json split = p;
  split["split"] = {{1}, json::array()};
  EXPECT_EQ(placement_with_islands(split, {0, 1})["replicated"], json({json::array(), json::array()}));
}

}  // namespace
}  // namespace moed::runtime::http
