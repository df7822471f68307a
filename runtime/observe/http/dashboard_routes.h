// The dashboard's rows of rank 0's HTTP route table: the page at / (one
// self-contained HTML file, runtime/observe/http/dashboard.html, embedded at build
// time) and the JSON endpoints it polls, answered from the control plane's
// published snapshot (runtime/observe/http/dashboard_api.h renders them).
#pragma once

#include <vector>

#include "runtime/control/control_plane.h"
#include "runtime/observe/http/http_server.h"
#include "runtime/trace/tracer.h"

namespace moed::runtime::http {

// `control_plane` must outlive the server that answers these routes.
std::vector<Route> dashboard_routes(const ControlPlane& control_plane, int layers, int experts);

// /api/trace?request_id=ID: rank 0's traces, the JSON of `moectl trace --json`
// (`tracer` must outlive the server).
Route trace_route(const trace::Tracer& tracer);

}  // namespace moed::runtime::http
