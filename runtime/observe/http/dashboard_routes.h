// The rows of rank 0's HTTP route table: /metrics, the traces, and the
// dashboard's page at / (one self-contained HTML file,
// runtime/observe/http/dashboard.html, embedded at build time) with the JSON
// endpoints it polls, answered from the published snapshot
// (runtime/observe/snapshot.h; runtime/observe/http/dashboard_api.h renders them).
#pragma once

#include <vector>

#include "runtime/observe/http/http_server.h"
#include "runtime/observe/snapshot.h"
#include "runtime/trace/tracer.h"

namespace moed::runtime::http {

// `snapshot` must outlive the server that answers these routes.
std::vector<Route> dashboard_routes(const Snapshot& snapshot, int layers, int experts);

// /metrics: the figures in Prometheus text (docs/metrics.md), as last
// published; a 503 before the first measured step.
Route metrics_route(const Snapshot& snapshot);

// /api/trace?request_id=ID: rank 0's traces, the JSON of `moectl trace --json`
// (`tracer` must outlive the server).
Route trace_route(const trace::Tracer& tracer);

}  // namespace moed::runtime::http
