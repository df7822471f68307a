#include "runtime/observe/http/dashboard_api.h"

#include <algorithm>
#include <charconv>
#include <cmath>

#include <fmt/format.h>

namespace moed::runtime::http {

using nlohmann::json;

namespace {

// The last fifth before a limit shows as "near".
constexpr double kNear = 0.8;

json band_json(double value, Band band) { return {{"value", value}, {"band", band_name(band)}}; }

}  // namespace

std::string_view band_name(Band band) {
  switch (band) {
    case Band::ok: return "ok";
    case Band::near: return "near";
    case Band::out: return "out";
    case Band::off: return "off";
    case Band::idle: return "idle";
  }
  return "off";
}

Band band_below(double value, double limit) {
  if (limit <= 0) return Band::off;
  if (value > limit) return Band::out;
  return value > kNear * limit ? Band::near : Band::ok;
}

Band band_around(double value, double centre, double halfwidth) {
  if (halfwidth <= 0) return Band::off;
  return band_below(std::abs(value - centre), halfwidth);
}

std::optional<std::string> check_query(const Query& query, const std::vector<std::string_view>& allowed) {
  for (auto it = query.begin(); it != query.end(); it = query.upper_bound(it->first)) {
    if (std::find(allowed.begin(), allowed.end(), it->first) == allowed.end()) {
      std::string takes;
      for (std::string_view a : allowed) takes += (takes.empty() ? "" : ", ") + std::string(a);
      return fmt::format("unknown parameter '{}': this page takes {}", it->first,
                         takes.empty() ? std::string("none") : takes);
    }
    if (query.count(it->first) > 1) return fmt::format("parameter '{}' given {} times", it->first, query.count(it->first));
  }
  return std::nullopt;
}

LayerOrError query_layer(const Query& query, int layers, const LayerNumbers& numbers) {
  const auto it = query.find("layer");
  if (it == query.end()) return {0, ""};
  const std::string& text = it->second;
  const int first = numbers.model(0), last = numbers.model(layers - 1);
  int layer = -1;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), layer);
  if (text.empty() || ec != std::errc() || end != text.data() + text.size())
    return {0, fmt::format("layer = '{}' is not a layer number ({} to {})", text, first, last)};
  if (const std::optional<int> moe = numbers.moe(layer, layers)) return {*moe, ""};
  if (layer < first || layer > last)
    return {0, fmt::format("layer = {} is out of range: the model has {} MoE layers ({} to {})", layer, layers, first,
                           last)};
  return {0, fmt::format("layer = {} is a dense layer: the dashboard shows the MoE layers ({} to {})", layer, first,
                         last)};
}

Answer json_answer(const json& body) { return {200, "application/json", body.dump()}; }

Answer bad_request(const std::string& message) { return {400, "text/plain; charset=utf-8", message + "\n"}; }

json health_json(const HealthInput& in) {
  const AlertThresholds& t = in.thresholds;
  const double activation_halfwidth = t.activation_band * t.expected_activation;
  json out = {{"step", in.status.value("step", 0)},
              {"epoch", in.status.value("epoch", 0)},
              {"state", in.status.value("state", "starting")},
              {"alerts", in.status.value("alerts", json::array())},
              {"migration", in.migration},
              {"bands",
               {{"activation_rate",
                 {{"centre", t.expected_activation}, {"halfwidth", activation_halfwidth}}},
                {"load_std_over_mean", {{"limit", t.load_std_over_mean}}},
                {"alltoall_p99_ms", {{"limit", t.alltoall_p99_ms}}}}},
              {"measured_steps", 0},
              {"job", nullptr},
              {"ranks", json::array()}};
  const auto signals = [&](double activation, double spread, double p99) {
    return json{{"activation_rate", band_json(activation, band_around(activation, t.expected_activation,
                                                                       activation_halfwidth))},
                {"load_std_over_mean", band_json(spread, band_below(spread, t.load_std_over_mean))},
                {"alltoall_p99_ms", band_json(p99, band_below(p99, t.alltoall_p99_ms))}};
  };
  if (!in.summary) return out;
  const Summary& s = *in.summary;
  out["measured_steps"] = s.measured_steps;
  // The job's figures are the ones /metrics and the alerts use.
  json job = signals(s.activation_rate, s.load_std_over_mean,
                     std::max(s.recent_rows_wait_p99_ms, s.recent_answers_wait_p99_ms));
  job["tokens_per_s"] = s.tokens_per_s;
  job["recent_tokens_per_s"] = s.recent_tokens_per_s;
  job["recent_step_p99_ms"] = s.recent_step_p99_ms;
  out["job"] = job;
  for (std::size_t r = 0; r < s.ranks.size(); ++r) {
    const RankFigures& f = s.ranks[r];
    json rank = signals(f.activation_rate, f.load_std_over_mean, f.alltoall_p99_ms);
    if (!f.routed)
      for (const char* key : {"activation_rate", "load_std_over_mean"}) rank[key]["band"] = band_name(Band::idle);
    rank["rank"] = r;
    rank["island"] = r < in.island_of_rank.size() ? in.island_of_rank[r] : 0;
    out["ranks"].push_back(rank);
  }
  return out;
}

json heatmap_json(int layer, int experts, int column_steps, const std::vector<LoadHeatmap::Column>& columns,
                  const Summary::Layer* figures) {
  json cols = json::array();
  for (const LoadHeatmap::Column& c : columns)
    cols.push_back({{"first_step", c.first_step}, {"last_step", c.last_step}, {"load", c.load}});
  json out = {{"layer", layer}, {"experts", experts}, {"column_steps", column_steps}, {"columns", cols},
              {"figures", nullptr}};
  if (figures) {
    json hot = json::array();
    for (const Summary::HotExpert& h : figures->hot) hot.push_back({{"expert", h.expert}, {"over_mean", h.over_mean}});
    out["figures"] = {{"activation_rate", figures->activation_rate},
                      {"load_std_over_mean", figures->load_std_over_mean},
                      {"load_max_over_mean", figures->load_max_over_mean},
                      {"hot", hot}};
  }
  return out;
}

json coactivation_json(const routing::RoutingStats& stats, int layer, int shown) {
  const int E = stats.experts();
  json matrix = json::array();
  double most = 0;
  for (int a = 0; a < E; ++a) {
    json row = json::array();
    for (int b = 0; b < E; ++b) {
      const double v = stats.coactivation(layer, a, b);
      most = std::max(most, v);
      row.push_back(v);
    }
    matrix.push_back(row);
  }
  return {{"layer", shown}, {"experts", E}, {"steps", stats.steps()}, {"half_life_steps", stats.half_life_steps()},
          {"matrix", matrix}, {"max", most}};
}

json placement_with_islands(json placement, const std::vector<int>& island_of_rank) {
  placement["islands"] = island_of_rank;
  json replicated = json::array();
  const json& slots = placement.at("slots");
  const json split = placement.value("split", json::array());  // a split expert's ranks hold shards, not copies
  for (std::size_t l = 0; l < slots.size(); ++l) {
    json experts = json::array();
    const json split_here = l < split.size() ? split[l] : json::array();
    for (std::size_t e = 0; e < slots[l].size(); ++e)
      if (slots[l][e].size() > 1 && std::find(split_here.begin(), split_here.end(), json(e)) == split_here.end())
        experts.push_back(e);
    replicated.push_back(experts);
  }
  placement["replicated"] = replicated;
  return placement;
}

}  // namespace moed::runtime::http
