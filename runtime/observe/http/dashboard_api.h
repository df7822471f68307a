// The dashboard's JSON endpoints, as pure functions of what the control
// plane published: the health view (per rank, the three golden signals and
// their bands), the expert heatmap of a layer, a layer's co-activation, the
// placement with its islands. The query checks live here too: a parameter
// the page does not take, one given twice, or a layer that is not a layer
// of the model is a 400 naming what was wrong.
//
// docs/metrics.md ("The dashboard") documents every field.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/layer_numbers.h"
#include "routing/routing_stats.h"
#include "runtime/observe/alerts.h"
#include "runtime/observe/http/http_server.h"
#include "runtime/observe/load_heatmap.h"
#include "runtime/observe/report.h"

namespace moed::runtime::http {

// Where a figure stands against its band: inside, in the last fifth before
// the limit, beyond it, no limit configured, or no figure (a rank that
// routed no tokens in the window).
enum class Band { ok, near, out, off, idle };
std::string_view band_name(Band band);
// A figure with an upper limit (0 = no limit).
Band band_below(double value, double limit);
// A figure that should stay within centre +- halfwidth (halfwidth 0 = no limit).
Band band_around(double value, double centre, double halfwidth);

// Checks the query: only the names in `allowed`, each once. The error, or
// nothing when the query is fine.
std::optional<std::string> check_query(const Query& query, const std::vector<std::string_view>& allowed);
// The `layer` parameter, the model's number of one of its `layers` MoE
// layers (`numbers`; absent: the first), as the MoE layer it is, or the
// error (out of range, a dense layer, not a number).
struct LayerOrError {
  int layer = 0;  // the MoE layer
  std::string error;  // empty: `layer` is good
};
LayerOrError query_layer(const Query& query, int layers, const LayerNumbers& numbers = {});

Answer json_answer(const nlohmann::json& body);
Answer bad_request(const std::string& message);  // 400, text naming what was wrong

struct HealthInput {
  const Summary* summary = nullptr;  // null before the first measured step
  AlertThresholds thresholds;
  std::vector<int> island_of_rank;
  nlohmann::json status;     // the status snapshot: step, epoch, state, alerts
  nlohmann::json migration;  // migration_json() of the last migration, or null
};
// {step, epoch, state, measured_steps, bands, job, ranks: [...], alerts, migration}
nlohmann::json health_json(const HealthInput& in);

// {layer, experts, column_steps, columns: [{first_step, last_step, load: [E]}], figures};
// `layer`: the model's number of the layer shown.
// `figures`: the layer's load-window figures from the summary (null without one).
nlohmann::json heatmap_json(int layer, int experts, int column_steps, const std::vector<LoadHeatmap::Column>& columns,
                            const Summary::Layer* figures);

// {layer, experts, steps, matrix: E x E (symmetric, zero diagonal), max} of
// MoE layer `layer`, shown as model layer `shown`.
nlohmann::json coactivation_json(const routing::RoutingStats& stats, int layer, int shown);

// The placement (control_views.h's placement_json) with `islands` (the
// island of each rank) and, per layer, the replicated experts.
nlohmann::json placement_with_islands(nlohmann::json placement, const std::vector<int>& island_of_rank);

}  // namespace moed::runtime::http
