// The golden-signal alerts of [metrics], evaluated on rank 0 after every
// step: pure functions of the figures, the thresholds and the clock, so that
// every band and every text is unit-tested.
//
// An alert fires once its condition has held for [metrics].alert_for_s
// seconds without a break (a single slow step does not page anyone), and
// stops as soon as the condition clears. Its text names the figure, the
// limit, how long it has held, the likely cause and the action, in moed's
// terms.
#pragma once

#include <array>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace moed::runtime {

enum class AlertKind { load_spread, activation_rate, alltoall_p99, step_p99 };
inline constexpr int kAlertKinds = 4;
// "load_spread": the value of the `alert` label of moed_alert_firing.
std::string_view alert_name(AlertKind kind);

struct AlertThresholds {
  double load_std_over_mean = 0;  // 0 = never
  double activation_band = 0;     // relative: |rate - k/E| > band * k/E; 0 = never
  double expected_activation = 0; // k / E, the configured rate
  double alltoall_p99_ms = 0;     // 0 = never
  double step_p99_ms = 0;         // 0 = never
  double for_s = 0;               // how long a condition holds before it fires
};

// The figures the alerts look at, each over the recent window.
struct AlertSignals {
  double load_std_over_mean = 0;            // mean over layers
  std::vector<double> layer_activation;     // per layer
  std::vector<int> model_layers;            // each layer's model layer number (what a breach names)
  double rows_wait_p99_ms = 0;              // dispatch
  double answers_wait_p99_ms = 0;           // combine
  double step_p99_ms = 0;
};

// A condition that holds now: the figure, its limit, and where (a layer or
// a phase; empty for the whole job).
struct Breach {
  double value = 0, limit = 0;
  std::string where;
  bool operator==(const Breach&) const = default;
};
// Whether `kind`'s condition holds for these signals (never when its
// threshold is 0). For the activation rate, the layer furthest outside its
// band; for the all-to-all, the slower phase over its limit.
std::optional<Breach> check_alert(AlertKind kind, const AlertSignals& signals, const AlertThresholds& limits);
// The text of a firing alert: figure, limit, time held, cause, action.
std::string alert_text(AlertKind kind, const Breach& breach, double held_s);

// The state across steps: since when each condition has held.
class AlertBook {
 public:
  explicit AlertBook(AlertThresholds limits) : limits_(limits) {}
  // Evaluates every alert at time `now` (seconds, any monotonic clock);
  // returns the texts of those firing, in AlertKind order.
  std::vector<std::string> update(const AlertSignals& signals, double now);
  bool firing(AlertKind kind) const { return firing_[std::size_t(kind)]; }
  const AlertThresholds& limits() const { return limits_; }

 private:
  AlertThresholds limits_;
  std::array<std::optional<double>, kAlertKinds> since_{};
  std::array<bool, kAlertKinds> firing_{};
};

}  // namespace moed::runtime
