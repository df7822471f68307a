#include "runtime/observe/snapshot.h"

#include <fmt/format.h>

#include <utility>

namespace moed::runtime {

using nlohmann::json;

namespace {

AlertThresholds alert_thresholds(const Config& c) {
  const MetricsConfig& m = c.metrics;
  return {.load_std_over_mean = m.alert_load_std_over_mean,
          .activation_band = m.alert_activation_band,
          .expected_activation = double(c.model.top_k) / double(c.model.experts),
          .alltoall_p99_ms = m.alert_alltoall_p99_ms,
          .step_p99_ms = m.alert_step_p99_ms,
          .for_s = m.alert_for_s};
}

// The alerts look at the recent window: a figure since start would keep an
// alert firing long after the cause has gone.
AlertSignals alert_signals(const Summary& s) {
  AlertSignals a;
  a.load_std_over_mean = s.load_std_over_mean;
  for (const Summary::Layer& layer : s.layers) {
    a.layer_activation.push_back(layer.activation_rate);
    a.model_layers.push_back(layer.model_layer);
  }
  a.rows_wait_p99_ms = s.recent_rows_wait_p99_ms;
  a.answers_wait_p99_ms = s.recent_answers_wait_p99_ms;
  a.step_p99_ms = s.recent_step_p99_ms;
  return a;
}

// The rank's resident memory for status: after the load, now, and the peak
// since the load (since the start where the kernel would not reset it);
// null where /proc does not say.
json memory_json(const std::optional<ProcessMemory>& after_load, const std::optional<ProcessMemory>& now,
                 bool peak_since_load) {
  if (!after_load || !now) return nullptr;
  return {{"rss_after_load_bytes", after_load->rss_bytes},
          {"rss_bytes", now->rss_bytes},
          {"peak_rss_bytes", now->peak_bytes},
          {"peak_since", peak_since_load ? "load" : "start"}};
}

}  // namespace

Snapshot::Snapshot(const Config& c, int rank, std::vector<int> island_of_rank)
    : rank_(rank),
      island_of_rank_(std::move(island_of_rank)),
      numbers_(runtime::layer_numbers(c.model)),
      front_door_(c.workload.kind == WorkloadKind::ingress),
      alert_book_(alert_thresholds(c)),
      heatmap_(int(c.model.layers), int(c.model.experts),
               rank == 0 && !c.metrics.listen.empty() ? int(c.metrics.heatmap_columns) : 0,
               int(c.metrics.heatmap_column_steps)) {}

void Snapshot::note_loaded() {
  memory_after_load_ = process_memory();
  peak_since_load_ = reset_peak_memory();
}

void Snapshot::publish(const ControlState& control, const Summary* summary) {
  json status = {{"rank", rank_},
                 {"epoch", control.figures.epoch},
                 {"step", control.step},
                 {"state", control.state},
                 {"migration", control.migration}};
  json alerts = json::array();
  std::string metrics;
  if (summary) {
    status["tokens_per_s"] = summary->tokens_per_s;
    status["recent_tokens_per_s"] = summary->recent_tokens_per_s;
    for (std::string& text : alert_book_.update(alert_signals(*summary), control.now)) alerts.push_back(std::move(text));
    if (control.stats_file_alert) alerts.push_back(*control.stats_file_alert);
    ControlFigures figures = control.figures;
    figures.alerts = alerts.size();
    for (int k = 0; k < kAlertKinds; ++k) figures.firing[std::size_t(k)] = alert_book_.firing(AlertKind(k));
    figures.stats_file_alert = control.stats_file_alert.has_value();
    figures.thresholds = alert_book_.limits();
    metrics = prometheus_text(*summary, figures);
  }
  status["memory"] = memory_json(memory_after_load_, process_memory(), peak_since_load_);
  std::lock_guard lock(mu_);
  if (!survivors_.is_null()) {
    status["survivors"] = survivors_;
    for (const json& loss : survivors_.value("losses", json::array())) alerts.push_back(loss.value("alert", ""));
  }
  status["alerts"] = std::move(alerts);
  status_ = std::move(status);
  if (summary) metrics_ = std::move(metrics), summary_ = *summary;
  migration_ = control.migration;
}

void Snapshot::set_survivors(json survivors) {
  std::lock_guard lock(mu_);
  survivors_ = std::move(survivors);
  // Shown before the next step publishes (a rank that just joined has published none).
  if (status_.is_null()) status_ = {{"rank", rank_}, {"state", "serving"}};
  status_["survivors"] = survivors_;
}

void Snapshot::set_placement(json placement) {
  std::lock_guard lock(mu_);
  placement_ = std::move(placement);
}

void Snapshot::set_migration(json migration) {
  std::lock_guard lock(mu_);
  migration_ = std::move(migration);
  if (!status_.is_null()) status_["migration"] = migration_;  // an idle daemon publishes no step that would show it
}

void Snapshot::set_stats(std::shared_ptr<const routing::RoutingStats> stats) {
  std::lock_guard lock(mu_);
  last_stats_ = std::move(stats);
}

void Snapshot::keep_heatmap(const Config& c) {
  std::lock_guard lock(mu_);
  if (heatmap_.capacity() == 0 && !c.metrics.listen.empty())
    heatmap_ = LoadHeatmap(int(c.model.layers), int(c.model.experts), int(c.metrics.heatmap_columns),
                           int(c.metrics.heatmap_column_steps));
}

void Snapshot::record_loads(const std::vector<std::uint64_t>& expert_load) {
  std::lock_guard lock(mu_);
  heatmap_.add_step(expert_load);
}

json Snapshot::status() const {
  std::lock_guard lock(mu_);
  json status = status_;
  if (front_door_ && !status.is_null()) status["idle_turns"] = idle_turns_.load(std::memory_order_relaxed);
  if (const std::uint64_t expired = lease_expired_.load(std::memory_order_relaxed); expired && !status.is_null())
    status["lease_expired"] = expired;
  if (front_door_counters_ && !status.is_null()) status["front_door"] = front_door_counters_();
  return status;
}

void Snapshot::set_front_door_counters(std::function<nlohmann::json()> counters) {
  front_door_counters_ = std::move(counters);
}

namespace {

// The front door's counters in Prometheus' text format: a flat object's
// numbers, and one level of nesting ("network": {...}) as a name prefix.
void append_front_door_metrics(const json& counters, int rank, std::string& out) {
  auto put = [&](const std::string& name, const json& value) {
    const std::string metric = "moed_front_door_" + name;
    out += fmt::format("# HELP {} the front door's {} (moectl status: front_door), this rank's\n# TYPE {} gauge\n", metric,
                       name, metric);
    out += fmt::format("{}{{rank=\"{}\"}} {}\n", metric, rank, value.get<double>());
  };
  for (const auto& [key, value] : counters.items()) {
    if (value.is_number()) put(key, value);
    if (value.is_object())
      for (const auto& [inner, v] : value.items())
        if (v.is_number()) put(key + "_" + inner, v);
  }
}

// Elastic serving's survivors (set_survivors), once a rank was lost: the
// epoch, the ranks serving and lost, and the last loss's pause here.
void append_survivor_metrics(const json& survivors, std::size_t world, std::string& out) {
  const json losses = survivors.value("losses", json::array());
  const std::size_t serving = survivors.value("members", json::array()).size();
  const double last_pause = losses.empty() ? 0.0 : losses.back().value("paused_ms", 0.0);
  const std::pair<const char*, double> figures[] = {
      {"survivors_epoch", survivors.value("epoch", 0.0)},
      {"ranks_serving", double(serving)},
      {"ranks_lost", survivors.value("ranks_lost", double(world - std::min(world, serving)))},
      {"last_loss_pause_ms", last_pause}};
  for (const auto& [name, value] : figures)
    out += fmt::format("# HELP moed_{0} elastic serving: {0} (moectl status: survivors)\n# TYPE moed_{0} gauge\n"
                       "moed_{0} {1}\n",
                       name, value);
}

}  // namespace

std::optional<std::string> Snapshot::metrics_text() const {
  std::lock_guard lock(mu_);
  if (metrics_.empty()) return std::nullopt;
  std::string out = metrics_;
  if (front_door_counters_) append_front_door_metrics(front_door_counters_(), rank_, out);
  if (!survivors_.is_null()) append_survivor_metrics(survivors_, island_of_rank_.size(), out);
  return out;
}

json Snapshot::placement() const {
  std::lock_guard lock(mu_);
  return placement_;
}

json Snapshot::migration() const {
  std::lock_guard lock(mu_);
  return migration_;
}

std::shared_ptr<const routing::RoutingStats> Snapshot::last_stats() const {
  std::lock_guard lock(mu_);
  return last_stats_;
}

Snapshot::DashboardView Snapshot::dashboard_view() const {
  std::lock_guard lock(mu_);
  return {summary_, status_, placement_, migration_, alert_book_.limits()};
}

std::vector<LoadHeatmap::Column> Snapshot::heatmap_layer(int layer) const {
  std::lock_guard lock(mu_);
  return heatmap_.layer(layer);
}

}  // namespace moed::runtime
