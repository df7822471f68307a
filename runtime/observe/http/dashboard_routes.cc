#include "runtime/observe/http/dashboard_routes.h"

#include <charconv>
#include <string>

#include "common/quote.h"
#include "runtime/observe/http/dashboard_api.h"
#include "runtime/observe/http/dashboard_page.h"

namespace moed::runtime::http {

namespace {

// The query of a page that takes only `layer`: the layer, or the 400.
std::optional<Answer> refuse_layer_query(const Query& query, int layers, const LayerNumbers& numbers, int& layer) {
  if (auto error = check_query(query, {"layer"})) return bad_request(*error);
  const LayerOrError parsed = query_layer(query, layers, numbers);
  if (!parsed.error.empty()) return bad_request(parsed.error);
  layer = parsed.layer;
  return std::nullopt;
}

std::optional<Answer> refuse_any_query(const Query& query) {
  if (auto error = check_query(query, {})) return bad_request(*error);
  return std::nullopt;
}

}  // namespace

std::vector<Route> dashboard_routes(const Snapshot& snapshot, int layers, int experts) {
  return {
      {"/", "the dashboard (docs/metrics.md#the-dashboard)",
       [](const Query&) { return Answer{200, "text/html; charset=utf-8", std::string(dashboard_page())}; }},
      {"/api/health", "JSON: per rank, the golden signals and their bands; the migration",
       [&snapshot](const Query& query) {
         if (auto refused = refuse_any_query(query)) return *refused;
         const Snapshot::DashboardView view = snapshot.dashboard_view();
         return json_answer(health_json({view.summary ? &*view.summary : nullptr, view.thresholds,
                                         snapshot.island_of_rank(), view.status, view.migration}));
       }},
      {"/api/heatmap", "JSON: ?layer=N, the experts' loads over time",
       [&snapshot, layers, experts](const Query& query) {
         int layer = 0;
         if (auto refused = refuse_layer_query(query, layers, snapshot.layer_numbers(), layer)) return *refused;
         const Snapshot::DashboardView view = snapshot.dashboard_view();
         const Summary::Layer* figures =
             view.summary && std::size_t(layer) < view.summary->layers.size() ? &view.summary->layers[std::size_t(layer)]
                                                                             : nullptr;
         return json_answer(heatmap_json(snapshot.layer_numbers().model(layer), experts, snapshot.heatmap_column_steps(),
                                         snapshot.heatmap_layer(layer), figures));
       }},
      {"/api/coactivation", "JSON: ?layer=N, how often two experts serve the same token",
       [&snapshot, layers](const Query& query) {
         int layer = 0;
         if (auto refused = refuse_layer_query(query, layers, snapshot.layer_numbers(), layer)) return *refused;
         const std::shared_ptr<const routing::RoutingStats> stats = snapshot.last_stats();
         if (!stats)
           return Answer{503, "text/plain; charset=utf-8",
                         "no routing statistics gathered yet: rank 0 gathers them every [stats].every_steps "
                         "when [stats].file is set, and for `moectl reoptimize`\n"};
         return json_answer(coactivation_json(*stats, layer, snapshot.layer_numbers().model(layer)));
       }},
      {"/api/placement", "JSON: which rank and island holds which expert",
       [&snapshot](const Query& query) {
         if (auto refused = refuse_any_query(query)) return *refused;
         return json_answer(placement_with_islands(snapshot.placement(), snapshot.island_of_rank()));
       }},
  };
}

Route metrics_route(const Snapshot& snapshot) {
  return {"/metrics", "the figures in Prometheus text (docs/metrics.md)", [&snapshot](const Query&) {
            std::optional<std::string> text = snapshot.metrics_text();
            if (!text)
              return Answer{503, "text/plain; charset=utf-8",
                            "no figures yet: they come after the first measured step (the warm-up is left out)\n"};
            return Answer{200, "text/plain; version=0.0.4; charset=utf-8", std::move(*text)};
          }};
}

// The dashboard's trace panel: /api/trace?request_id=ID, the same JSON as
// `moectl trace --json ID` (rank 0 serves HTTP, and rank 0 holds the traces).
Route trace_route(const trace::Tracer& tracer) {
  return {"/api/trace", "JSON: ?request_id=ID, one traced request's tokens (moectl trace --json)",
          [&tracer](const Query& query) {
            if (auto error = check_query(query, {"request_id"})) return bad_request(*error);
            const auto it = query.find("request_id");
            if (it == query.end())
              return bad_request("name a request: /api/trace?request_id=ID (a sampled id, or one followed "
                                       "with `moectl trace --follow ID`)");
            std::uint64_t id = 0;
            const std::string& text = it->second;
            const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), id);
            if (ec != std::errc() || end != text.data() + text.size() || text.empty())
              return bad_request("request_id " + quote_input(text) + " is not a request id (0 to 2^64-1)");
            nlohmann::json body = tracer.answer(id);
            if (body.value("ok", true) == false)
              return Answer{404, "text/plain; charset=utf-8",
                                  body["error"].value("message", std::string("no trace")) + "\n"};
            return json_answer(body);
          }};
}

}  // namespace moed::runtime::http
