#include "runtime/observe/alerts.h"

#include <cmath>

#include <fmt/format.h>

namespace moed::runtime {

std::string_view alert_name(AlertKind kind) {
  switch (kind) {
    case AlertKind::load_spread: return "load_spread";
    case AlertKind::activation_rate: return "activation_rate";
    case AlertKind::alltoall_p99: return "alltoall_p99";
    case AlertKind::step_p99: return "step_p99";
  }
  return "unknown";
}

std::optional<Breach> check_alert(AlertKind kind, const AlertSignals& s, const AlertThresholds& t) {
  switch (kind) {
    case AlertKind::load_spread:
      if (t.load_std_over_mean > 0 && s.load_std_over_mean > t.load_std_over_mean)
        return Breach{s.load_std_over_mean, t.load_std_over_mean, ""};
      return std::nullopt;
    case AlertKind::activation_rate: {
      if (t.activation_band <= 0 || t.expected_activation <= 0) return std::nullopt;
      const double allowed = t.activation_band * t.expected_activation;
      std::optional<Breach> worst;
      double worst_off = allowed;
      for (std::size_t l = 0; l < s.layer_activation.size(); ++l) {
        const double off = std::abs(s.layer_activation[l] - t.expected_activation);
        if (off <= worst_off) continue;
        worst_off = off;
        const bool low = s.layer_activation[l] < t.expected_activation;
        worst = Breach{s.layer_activation[l], t.expected_activation + (low ? -allowed : allowed),
                       fmt::format("layer {}", l < s.model_layers.size() ? s.model_layers[l] : int(l))};
      }
      return worst;
    }
    case AlertKind::alltoall_p99: {
      if (t.alltoall_p99_ms <= 0) return std::nullopt;
      const bool dispatch_worse = s.rows_wait_p99_ms >= s.answers_wait_p99_ms;
      const double worst = dispatch_worse ? s.rows_wait_p99_ms : s.answers_wait_p99_ms;
      if (worst <= t.alltoall_p99_ms) return std::nullopt;
      return Breach{worst, t.alltoall_p99_ms, dispatch_worse ? "dispatch" : "combine"};
    }
    case AlertKind::step_p99:
      if (t.step_p99_ms > 0 && s.step_p99_ms > t.step_p99_ms) return Breach{s.step_p99_ms, t.step_p99_ms, ""};
      return std::nullopt;
  }
  return std::nullopt;
}

std::string alert_text(AlertKind kind, const Breach& b, double held_s) {
  const std::string held = fmt::format("for {:.0f} s", held_s);
  switch (kind) {
    case AlertKind::load_spread:
      return fmt::format(
          "expert load std/mean {:.2f} > {:.2f} {}: routing favours a few hot experts (moed_hot_expert, `moectl "
          "stats`), so the ranks holding them are slow and the others wait (the combine wait); run `moectl "
          "reoptimize --apply` to place and replicate them by the live statistics so the ranks' load evens out "
          "(this routing figure stays); if the skew is the model's own, raise [metrics].alert_load_std_over_mean",
          b.value, b.limit, held);
    case AlertKind::activation_rate:
      return fmt::format(
          "activation rate {:.3f} in {} is outside its band (limit {:.3f}) {}: the router's choices drifted from "
          "the configured k/E (a [router] mode, top_p or min_k/max_k change, or a collapsed gate in the weights); "
          "check `moed --print-config` for [router] and the per-layer moed_layer_activation_rate",
          b.value, b.where, b.limit, held);
    case AlertKind::alltoall_p99:
      return fmt::format(
          "all-to-all {} wait p99 {:.1f} ms > {:.1f} ms {}: rows or answers travel slowly; look at "
          "moed_bytes_sent_total{{link=\"cross_island\"}} and the load spread: run `moectl reoptimize --apply` "
          "to cut cross-island bytes or spread hot experts, and check the transport ([comm].backend, the link)",
          b.where, b.value, b.limit, held);
    case AlertKind::step_p99:
      return fmt::format(
          "step p99 {:.1f} ms > {:.1f} ms {}: see which phase grew in the per-step log ([log].per_step) or "
          "moed_alltoall_wait_ms; a running migration (`moectl migration`) also slows steps while it transfers",
          b.value, b.limit, held);
  }
  return "";
}

std::vector<std::string> AlertBook::update(const AlertSignals& signals, double now) {
  std::vector<std::string> texts;
  for (int k = 0; k < kAlertKinds; ++k) {
    const AlertKind kind = AlertKind(k);
    const std::optional<Breach> breach = check_alert(kind, signals, limits_);
    std::optional<double>& since = since_[std::size_t(k)];
    if (!breach) {
      since.reset();
      firing_[std::size_t(k)] = false;
      continue;
    }
    if (!since) since = now;
    const double held = now - *since;
    firing_[std::size_t(k)] = held >= limits_.for_s;
    if (firing_[std::size_t(k)]) texts.push_back(alert_text(kind, *breach, held));
  }
  return texts;
}

}  // namespace moed::runtime
