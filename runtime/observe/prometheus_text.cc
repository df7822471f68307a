#include "runtime/observe/prometheus_text.h"

#include <string_view>

#include <fmt/format.h>

#include "placement/placement.h"

namespace moed::runtime {

namespace {

// Appends metric families: family() writes HELP and TYPE once, sample() the
// series under it.
class Exposition {
 public:
  void family(std::string_view name, std::string_view type, std::string_view help) {
    out_ += fmt::format("# HELP {} {}\n# TYPE {} {}\n", name, help, name, type);
  }
  void sample(std::string_view name, double value, std::string_view labels = "") {
    out_ += fmt::format("{}{} {}\n", name, labels.empty() ? "" : fmt::format("{{{}}}", labels), value);
  }
  void gauge(std::string_view name, std::string_view help, double value) {
    family(name, "gauge", help);
    sample(name, value);
  }
  std::string take() { return std::move(out_); }

 private:
  std::string out_;
};

constexpr std::string_view kMigrationStates[] = {"none",   "prepare", "transfer", "verify",
                                                 "commit", "release", "committed", "aborted"};

}  // namespace

std::string prometheus_text(const Summary& s, const ControlFigures& c) {
  Exposition x;
  // Rates and latencies: since start, and over the recent window.
  x.gauge("moed_tokens_per_second", "tokens served per second of wall time, since start", s.tokens_per_s);
  x.gauge("moed_recent_tokens_per_second", "tokens served per second of wall time, over the recent window",
          s.recent_tokens_per_s);
  x.family("moed_tokens_total", "counter", "tokens that passed every MoE layer in the measured steps");
  x.sample("moed_tokens_total", s.tokens_served);
  x.family("moed_steps_total", "counter", "measured steps served (the warm-up left out)");
  x.sample("moed_steps_total", double(s.measured_steps));
  x.family("moed_step_latency_ms", "gauge", "step latency, wall time from step boundary to step boundary, since start");
  x.sample("moed_step_latency_ms", s.step_p50_ms, "quantile=\"0.5\"");
  x.sample("moed_step_latency_ms", s.step_p99_ms, "quantile=\"0.99\"");
  x.family("moed_recent_step_latency_ms", "gauge", "step latency over the recent window");
  x.sample("moed_recent_step_latency_ms", s.recent_step_p50_ms, "quantile=\"0.5\"");
  x.sample("moed_recent_step_latency_ms", s.recent_step_p99_ms, "quantile=\"0.99\"");
  x.family("moed_alltoall_wait_ms", "gauge",
           "per layer, time idle waiting for rows (dispatch) and then only for answers (combine), since start");
  x.sample("moed_alltoall_wait_ms", s.rows_wait_p50_ms, "phase=\"dispatch\",quantile=\"0.5\"");
  x.sample("moed_alltoall_wait_ms", s.rows_wait_p99_ms, "phase=\"dispatch\",quantile=\"0.99\"");
  x.sample("moed_alltoall_wait_ms", s.answers_wait_p50_ms, "phase=\"combine\",quantile=\"0.5\"");
  x.sample("moed_alltoall_wait_ms", s.answers_wait_p99_ms, "phase=\"combine\",quantile=\"0.99\"");
  x.family("moed_recent_alltoall_wait_ms", "gauge", "the all-to-all waits over the recent window");
  x.sample("moed_recent_alltoall_wait_ms", s.recent_rows_wait_p50_ms, "phase=\"dispatch\",quantile=\"0.5\"");
  x.sample("moed_recent_alltoall_wait_ms", s.recent_rows_wait_p99_ms, "phase=\"dispatch\",quantile=\"0.99\"");
  x.sample("moed_recent_alltoall_wait_ms", s.recent_answers_wait_p50_ms, "phase=\"combine\",quantile=\"0.5\"");
  x.sample("moed_recent_alltoall_wait_ms", s.recent_answers_wait_p99_ms, "phase=\"combine\",quantile=\"0.99\"");

  // Routing: the whole job, then per layer over the load window.
  x.gauge("moed_activation_rate", "expert parameters run per token over all expert parameters, since start",
          s.activation_rate);
  x.gauge("moed_expert_load_std_over_mean", "spread of tokens over experts over the load window, mean over layers",
          s.load_std_over_mean);
  x.gauge("moed_expert_load_max_over_mean", "hottest expert's load over the mean over the load window, mean over layers",
          s.load_max_over_mean);
  const auto per_layer = [&](std::string_view name, std::string_view help, auto figure) {
    x.family(name, "gauge", help);
    for (std::size_t l = 0; l < s.layers.size(); ++l)
      x.sample(name, figure(s.layers[l]), fmt::format("layer=\"{}\"", s.layers[l].model_layer));
  };
  per_layer("moed_layer_activation_rate", "activation rate of a layer over the load window",
            [](const Summary::Layer& f) { return f.activation_rate; });
  per_layer("moed_layer_expert_load_std_over_mean", "spread of a layer's tokens over its experts over the load window",
            [](const Summary::Layer& f) { return f.load_std_over_mean; });
  per_layer("moed_layer_expert_load_max_over_mean", "a layer's hottest expert's load over the mean over the load window",
            [](const Summary::Layer& f) { return f.load_max_over_mean; });
  x.family("moed_expert_load_over_mean_bucket", "gauge",
           "experts of a layer whose load over the mean is at or below le, over the load window");
  for (std::size_t l = 0; l < s.layers.size(); ++l) {
    const Summary::Layer& f = s.layers[l];
    for (std::size_t b = 0; b < Summary::kLoadBuckets.size(); ++b)
      x.sample("moed_expert_load_over_mean_bucket", double(f.at_or_below[b]),
               fmt::format("layer=\"{}\",le=\"{}\"", f.model_layer, Summary::kLoadBuckets[b]));
    x.sample("moed_expert_load_over_mean_bucket", double(f.experts),
             fmt::format("layer=\"{}\",le=\"+Inf\"", f.model_layer));
  }
  x.family("moed_hot_expert", "gauge", "id of a layer's hottest experts over the load window (position 1: the hottest)");
  for (std::size_t l = 0; l < s.layers.size(); ++l)
    for (std::size_t i = 0; i < s.layers[l].hot.size(); ++i)
      x.sample("moed_hot_expert", s.layers[l].hot[i].expert,
               fmt::format("layer=\"{}\",position=\"{}\"", s.layers[l].model_layer, i + 1));
  x.family("moed_hot_expert_load_over_mean", "gauge", "load over the mean of the expert moed_hot_expert names");
  for (std::size_t l = 0; l < s.layers.size(); ++l)
    for (std::size_t i = 0; i < s.layers[l].hot.size(); ++i)
      x.sample("moed_hot_expert_load_over_mean", s.layers[l].hot[i].over_mean,
               fmt::format("layer=\"{}\",position=\"{}\"", s.layers[l].model_layer, i + 1));

  // The same signals per rank (the dashboard's health view): bounded by the job's ranks.
  const auto per_rank = [&](std::string_view name, std::string_view help, auto figure) {
    if (s.ranks.empty()) return;
    x.family(name, "gauge", help);
    for (std::size_t r = 0; r < s.ranks.size(); ++r) x.sample(name, figure(s.ranks[r]), fmt::format("rank=\"{}\"", r));
  };
  per_rank("moed_rank_activation_rate", "activation rate of the tokens a rank routed, over the load window",
           [](const RankFigures& f) { return f.activation_rate; });
  per_rank("moed_rank_expert_load_std_over_mean",
           "spread over experts of the tokens a rank routed, over the load window, mean over layers",
           [](const RankFigures& f) { return f.load_std_over_mean; });
  per_rank("moed_rank_recent_alltoall_wait_p99_ms",
           "a rank's own recent p99 all-to-all wait, the larger of dispatch and combine",
           [](const RankFigures& f) { return f.alltoall_p99_ms; });

  // Links, placement, migration.
  x.family("moed_bytes_sent_total", "counter", "dispatch and combine bytes by link class");
  for (int k = 0; k < placement::kLinkClasses; ++k)
    x.sample("moed_bytes_sent_total", double(s.bytes[std::size_t(k)]),
             fmt::format("link=\"{}\"", placement::to_string(placement::LinkClass(k))));
  x.gauge("moed_placement_epoch", "epoch of the placement being served", double(c.epoch));
  x.family("moed_migration_bytes", "gauge", "bytes of the current (or last) migration; done=\"true\": moved so far");
  x.sample("moed_migration_bytes", double(c.migration_bytes));
  x.sample("moed_migration_bytes", double(c.migration_done_bytes), "done=\"true\"");
  x.gauge("moed_migration_progress", "bytes moved over bytes to move of the current (or last) migration; 0 when none",
          c.migration_bytes ? double(c.migration_done_bytes) / double(c.migration_bytes) : 0.0);
  x.family("moed_migration_state", "gauge", "1 for the state of the current (or last) migration, 0 for the others");
  for (std::string_view state : kMigrationStates)
    x.sample("moed_migration_state", state == c.migration_state ? 1.0 : 0.0, fmt::format("state=\"{}\"", state));

  // Alerts.
  x.gauge("moed_alerts", "alerts firing (the [metrics] thresholds and failed file writes)", double(c.alerts));
  x.family("moed_alert_firing", "gauge", "1 while the alert fires");
  for (int k = 0; k < kAlertKinds; ++k)
    x.sample("moed_alert_firing", c.firing[std::size_t(k)] ? 1.0 : 0.0,
             fmt::format("alert=\"{}\"", alert_name(AlertKind(k))));
  x.sample("moed_alert_firing", c.stats_file_alert ? 1.0 : 0.0, "alert=\"stats_file\"");
  const AlertThresholds& t = c.thresholds;
  const double band = t.activation_band * t.expected_activation;
  x.family("moed_alert_threshold", "gauge", "the [metrics] limit of each alert; 0 = the alert is off");
  x.sample("moed_alert_threshold", t.load_std_over_mean, "alert=\"load_spread\"");
  x.sample("moed_alert_threshold", band > 0 ? t.expected_activation - band : 0.0, "alert=\"activation_rate_low\"");
  x.sample("moed_alert_threshold", band > 0 ? t.expected_activation + band : 0.0, "alert=\"activation_rate_high\"");
  x.sample("moed_alert_threshold", t.alltoall_p99_ms, "alert=\"alltoall_p99\"");
  x.sample("moed_alert_threshold", t.step_p99_ms, "alert=\"step_p99\"");
  x.gauge("moed_alert_for_seconds", "how long a condition holds before its alert fires ([metrics].alert_for_s)", t.for_s);

  // Router policies, when any is on (docs/router-policies.md).
  if (s.router_policies) {
    const RouterFigures& r = s.router;
    x.family("moed_router_pairs_total", "counter",
             "(token, expert) pairs the router policies saw, dropped and moved (measured steps)");
    x.sample("moed_router_pairs_total", double(r.counts.pairs), "fate=\"all\"");
    x.sample("moed_router_pairs_total", double(r.counts.dropped), "fate=\"dropped\"");
    x.sample("moed_router_pairs_total", double(r.counts.moved), "fate=\"moved\"");
    x.family("moed_router_weight_moved", "gauge", "share of the gate-weight mass demoted (moved) or dropped");
    x.sample("moed_router_weight_moved", r.weight_moved, "fate=\"moved\"");
    x.sample("moed_router_weight_moved", r.weight_dropped, "fate=\"dropped\"");
    x.gauge("moed_router_changed_rate",
            "share of the router's own (token, expert) pairs that bias balancing or the load policy changed",
            r.changed_rate);
    x.family("moed_router_jitter_rate", "gauge", "tokens whose experts change under relative hidden-state noise eps");
    x.sample("moed_router_jitter_rate", r.jitter_rate[0], "eps=\"1e-4\"");
    x.sample("moed_router_jitter_rate", r.jitter_rate[1], "eps=\"1e-3\"");
    x.gauge("moed_router_flip_rate", "tokens whose experts differ from their request's previous position's",
            r.flip_rate);
  }

  // Failures.
  x.family("moed_file_write_failures_total", "counter", "failed writes of a file the daemon keeps (the last good one stays)");
  x.sample("moed_file_write_failures_total", double(c.stats_write_failures), "file=\"stats\"");
  x.sample("moed_file_write_failures_total", double(c.committed_write_failures), "file=\"committed_placement\"");
  if (!s.nonfinite_by_expert.empty())
    x.family("moed_nonfinite_terms_total", "counter",
             "expert output terms that were NaN or inf (their tokens' outputs carry NaN), per expert with any");
  for (const Summary::ExpertTerms& e : s.nonfinite_by_expert)
    x.sample("moed_nonfinite_terms_total", double(e.terms), fmt::format("layer=\"{}\",expert=\"{}\"", e.layer, e.expert));
  return x.take();
}

}  // namespace moed::runtime
