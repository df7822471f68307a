// The figures in Prometheus' text exposition format (version 0.0.4): the
// body of the HTTP endpoint's /metrics and of `moectl metrics`. Every metric
// is documented in docs/metrics.md.
//
// The series are bounded by the model's shape, never by the traffic: per
// layer, a fixed set (activation rate, load spread, [metrics].hot_experts
// hottest experts with their ids as values, and a fixed bucket list of the
// experts' loads over the mean); nothing per expert per token, nothing per
// request. The one exception, moed_nonfinite_terms_total, has a series only
// per expert that produced NaN or inf (none on a healthy run), so it too is
// bounded by layers x experts.
#pragma once

#include <array>
#include <cstdint>
#include <string>

#include "runtime/observe/alerts.h"
#include "runtime/observe/report.h"

namespace moed::runtime {

// What the control plane adds to the run's figures.
struct ControlFigures {
  std::uint64_t epoch = 0;
  std::size_t alerts = 0;  // every alert in status, the file-write one included
  std::uint64_t migration_done_bytes = 0, migration_bytes = 0;
  std::string migration_state = "none";  // state_name() of the last migration, or "none"
  std::uint64_t stats_write_failures = 0, committed_write_failures = 0;  // since start
  std::array<bool, kAlertKinds> firing{};
  bool stats_file_alert = false;
  AlertThresholds thresholds{};
};

std::string prometheus_text(const Summary& s, const ControlFigures& c);

}  // namespace moed::runtime
