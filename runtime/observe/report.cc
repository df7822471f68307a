#include "runtime/observe/report.h"

#include <algorithm>
#include <numeric>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "common/atomic_file.h"
#include "common/error.h"
#include "common/summary_stats.h"
#include "runtime/router/policies/jitter.h"

namespace moed::runtime {

RouterFigures RouterFigures::from(const RouterCounters& c) {
  const auto rate = [](std::uint64_t n, std::uint64_t of) { return of ? double(n) / double(of) : 0.0; };
  RouterFigures f;
  f.counts = c;
  f.dropped_rate = rate(c.dropped, c.pairs), f.moved_rate = rate(c.moved, c.pairs);
  f.weight_dropped = c.tokens ? double(c.weight_dropped) / kWeightUnit / double(c.tokens) : 0.0;
  f.weight_moved = c.tokens ? double(c.weight_moved) / kWeightUnit / double(c.tokens) : 0.0;
  f.changed_rate = rate(c.changed, c.selected);
  f.flip_rate = rate(c.flipped, c.flip_tested);
  for (std::size_t i = 0; i < f.jitter_rate.size(); ++i) f.jitter_rate[i] = rate(c.jitter_changed[i], c.jitter_tested);
  return f;
}

Report::Report(RunInfo info, int load_window_steps, int recent_steps, int hot_experts)
    : info_(std::move(info)),
      window_(load_window_steps),
      hot_experts_(hot_experts),
      recent_steps_(recent_steps),
      window_load_(std::size_t(info_.shape.layers) * std::size_t(info_.shape.experts), 0),
      window_tokens_(std::size_t(info_.shape.layers), 0),
      recent_wall_(std::size_t(recent_steps)),
      recent_tokens_(std::size_t(recent_steps)),
      recent_rows_wait_(std::size_t(recent_steps) * std::size_t(info_.shape.layers)),
      recent_answers_wait_(std::size_t(recent_steps) * std::size_t(info_.shape.layers)),
      rank_signals_(std::max(1, info_.ranks), info_.shape.layers, info_.shape.experts, load_window_steps,
                    recent_steps) {}

void Report::continue_with_ranks(int ranks, std::string topology) {
  info_.ranks = ranks;
  info_.topology = std::move(topology);
  rank_signals_ = RankSignals(std::max(1, ranks), info_.shape.layers, info_.shape.experts, window_, recent_steps_);
}

std::size_t Report::retained_samples() const {
  return ring_.size() + ring_tokens_.size() + recent_wall_.size() + recent_tokens_.size() + recent_rows_wait_.size() +
         recent_answers_wait_.size() + rank_signals_.retained_samples();
}

void Report::boundary(double now) {
  if (open_.open && open_.measured) {
    const double wall = now - open_.start;
    step_s_.add(wall);
    wall_time_ += wall;
    wall_token_layers_ += open_.token_layers;
    recent_wall_.add(wall);
    recent_tokens_.add(double(open_.token_layers));
  }
  open_ = {true, false, now, 0};
}

void Report::add_step(std::uint64_t step, const StepRecord& rec) {
  ++served_;
  const std::size_t experts = std::size_t(info_.shape.layers) * std::size_t(info_.shape.experts);
  for (const auto& [key, terms] : rec.nonfinite) {
    if (key >= experts)
      MOED_THROW(Internal, "step {}: non-finite terms of expert key {}, the model has {} (layers x experts)", step,
                 key, experts);
    if (nonfinite_.empty()) nonfinite_.assign(experts, 0);
    nonfinite_[key] += terms;
  }
  if (step < info_.warmup_steps) return;
  ++measured_;
  open_.measured = true;
  open_.token_layers = rec.token_layers;
  time_ += rec.total;
  route_ += rec.route, plan_ += rec.plan, rows_wait_ += rec.rows_wait;
  experts_ += rec.experts, shared_ += rec.shared, answers_wait_ += rec.answers_wait, other_ += rec.other;
  bytes_copied_ += rec.bytes_copied;
  for (int c = 0; c < placement::kLinkClasses; ++c) bytes_[c] += rec.bytes_sent[c];
  pairs_ += rec.pairs;
  token_layers_ += rec.token_layers;
  saturated_ += rec.saturated;
  router_.add(rec.router);
  for (double d : rec.rows_wait_per_layer) rows_wait_s_.add(d), recent_rows_wait_.add(d);
  for (double c : rec.answers_wait_per_layer) answers_wait_s_.add(c), recent_answers_wait_.add(c);

  // The load window: the oldest step leaves the running sum, this one enters.
  if (rec.expert_load.size() != window_load_.size())
    MOED_THROW(Internal, "step {}: {} expert loads, the report expects {} (layers x experts)", step,
               rec.expert_load.size(), window_load_.size());
  if (rec.tokens_per_layer.size() != window_tokens_.size())
    MOED_THROW(Internal, "step {}: rows of {} layers, the model has {}", step, rec.tokens_per_layer.size(),
               window_tokens_.size());
  if (ring_.size() < std::size_t(window_)) {
    ring_.push_back(rec.expert_load);
    ring_tokens_.push_back(rec.tokens_per_layer);
  } else {
    std::vector<std::uint64_t>& oldest = ring_[ring_next_];
    for (std::size_t i = 0; i < oldest.size(); ++i) window_load_[i] -= oldest[i];
    oldest = rec.expert_load;
    std::vector<std::uint64_t>& oldest_tokens = ring_tokens_[ring_next_];
    for (std::size_t l = 0; l < oldest_tokens.size(); ++l) window_tokens_[l] -= oldest_tokens[l];
    oldest_tokens = rec.tokens_per_layer;
    ring_next_ = (ring_next_ + 1) % ring_.size();
  }
  for (std::size_t i = 0; i < window_load_.size(); ++i) window_load_[i] += rec.expert_load[i];
  for (std::size_t l = 0; l < window_tokens_.size(); ++l) window_tokens_[l] += rec.tokens_per_layer[l];
  rank_signals_.add_step(rec);
}

namespace {

double ms(double seconds) { return seconds * 1e3; }

std::string human_bytes(double b) {
  const char* units[] = {"B", "KB", "MB", "GB", "TB"};
  int u = 0;
  while (b >= 1000 && u < 4) b /= 1000, ++u;
  return fmt::format("{:.1f} {}", b, units[u]);
}

}  // namespace

std::string Report::step_line(std::uint64_t step, const StepRecord& rec) const {
  std::uint64_t all = rec.bytes_sent[0] + rec.bytes_sent[1] + rec.bytes_sent[2];
  return fmt::format(
      "step {}{}: engine {:.1f} ms, {:.0f} tokens/s of engine time | route {:.1f} plan {:.1f} experts {:.1f} "
      "other {:.1f} | waits: rows {:.1f} answers {:.1f} ms | cross-island {:.0f}% of {}",
      step, step < info_.warmup_steps ? " (warm-up)" : "", ms(rec.total),
      double(rec.token_layers) / info_.shape.layers / rec.total, ms(rec.route), ms(rec.plan), ms(rec.experts),
      ms(rec.other), ms(rec.rows_wait), ms(rec.answers_wait), all ? 100.0 * double(rec.bytes_sent[2]) / double(all) : 0.0,
      human_bytes(double(all)));
}

Summary Report::summary() const {
  Summary s;
  s.measured_steps = measured_;
  for (std::size_t key = 0; key < nonfinite_.size(); ++key) {
    if (!nonfinite_[key]) continue;
    const int E = info_.shape.experts;
    s.nonfinite += nonfinite_[key];
    // Named by the model's layer number, as every figure shows it.
    s.nonfinite_by_expert.push_back(
        {info_.shape.spec.model_layer(int(key / std::size_t(E))), int(key % std::size_t(E)), nonfinite_[key]});
  }
  if (measured_ == 0) return s;
  const double n = double(measured_);
  s.route_ms = ms(route_) / n, s.plan_ms = ms(plan_) / n, s.rows_wait_ms = ms(rows_wait_) / n;
  s.experts_ms = ms(experts_) / n, s.shared_ms = ms(shared_) / n, s.answers_wait_ms = ms(answers_wait_) / n, s.other_ms = ms(other_) / n;
  s.bytes_copied = double(bytes_copied_) / n;
  s.engine_ms = ms(time_) / n;
  s.bytes = bytes_;
  s.saturated = saturated_;
  s.router_policies = !info_.router_policies.empty();
  s.router = RouterFigures::from(router_);
  // A token counts once it has passed every MoE layer: rows served over
  // layers, over the wall time of the steps whose wall time is known.
  s.tokens_per_s = wall_time_ > 0 ? double(wall_token_layers_) / info_.shape.layers / wall_time_ : 0.0;
  s.step_p50_ms = ms(step_s_.quantile(0.50)), s.step_p99_ms = ms(step_s_.quantile(0.99));
  s.rows_wait_p50_ms = ms(rows_wait_s_.quantile(0.50)), s.rows_wait_p99_ms = ms(rows_wait_s_.quantile(0.99));
  s.answers_wait_p50_ms = ms(answers_wait_s_.quantile(0.50)), s.answers_wait_p99_ms = ms(answers_wait_s_.quantile(0.99));
  s.experts_per_token = token_layers_ ? double(pairs_) / double(token_layers_) : 0.0;
  s.rows_per_step = double(token_layers_) / n;
  s.activation_rate = s.experts_per_token / info_.shape.experts;

  s.tokens_served = double(token_layers_) / info_.shape.layers;
  const double recent_wall = recent_wall_.sum();
  s.recent_tokens_per_s = recent_wall > 0 ? recent_tokens_.sum() / info_.shape.layers / recent_wall : 0.0;
  s.recent_step_p50_ms = ms(recent_wall_.quantile(0.50)), s.recent_step_p99_ms = ms(recent_wall_.quantile(0.99));
  s.recent_rows_wait_p50_ms = ms(recent_rows_wait_.quantile(0.50));
  s.recent_rows_wait_p99_ms = ms(recent_rows_wait_.quantile(0.99));
  s.recent_answers_wait_p50_ms = ms(recent_answers_wait_.quantile(0.50));
  s.recent_answers_wait_p99_ms = ms(recent_answers_wait_.quantile(0.99));
  s.ranks = rank_signals_.figures();

  // Over the window of the last steps, per layer (the job's load spread is
  // the mean over layers).
  const int E = info_.shape.experts, L = info_.shape.layers;
  std::vector<double> load(std::size_t(E), 0.0);
  std::vector<int> order(static_cast<std::size_t>(E));
  s.layers.resize(std::size_t(L));
  for (int l = 0; l < L; ++l) {
    Summary::Layer& f = s.layers[std::size_t(l)];
    f.model_layer = info_.shape.spec.model_layer(l);
    double pairs = 0;
    for (int e = 0; e < E; ++e) {
      load[std::size_t(e)] = double(window_load_[std::size_t(l) * E + e]);
      pairs += load[std::size_t(e)];
    }
    const std::uint64_t tokens = window_tokens_[std::size_t(l)];
    f.activation_rate = tokens ? pairs / double(tokens) / E : 0.0;
    f.load_std_over_mean = std_over_mean(load);
    f.load_max_over_mean = max_over_mean(load);
    s.load_std_over_mean += f.load_std_over_mean / L;
    s.load_max_over_mean += f.load_max_over_mean / L;
    const double mean = pairs / E;
    f.experts = std::uint64_t(E);
    for (int e = 0; e < E; ++e) {
      const double over = mean > 0 ? load[std::size_t(e)] / mean : 0.0;
      for (std::size_t b = 0; b < Summary::kLoadBuckets.size(); ++b) f.at_or_below[b] += over <= Summary::kLoadBuckets[b];
    }
    // The hottest first; ties go to the lower expert id.
    std::iota(order.begin(), order.end(), 0);
    const std::size_t n = std::min<std::size_t>(std::size_t(hot_experts_), std::size_t(E));
    std::partial_sort(order.begin(), order.begin() + std::ptrdiff_t(n), order.end(), [&](int a, int b) {
      return load[std::size_t(a)] != load[std::size_t(b)] ? load[std::size_t(a)] > load[std::size_t(b)] : a < b;
    });
    for (std::size_t i = 0; i < n; ++i)
      f.hot.push_back({order[i], mean > 0 ? load[std::size_t(order[i])] / mean : 0.0});
  }
  return s;
}

void Report::print(std::ostream& os) const {
  Summary s = summary();
  std::uint64_t all = s.bytes[0] + s.bytes[1] + s.bytes[2];
  auto share = [&](int c) { return all ? 100.0 * double(s.bytes[c]) / double(all) : 0.0; };
  os << fmt::format(
      "moed: {} rank{}, {}; {}; {} steps of {} ({} warm-up)\n"
      "  workload           {}\n"
      "  placement          {}\n"
      "  transport          {}{}; {}\n"
      "  numerics           {}; experts on the {}\n"
      "  tokens/s           {:.0f}  (wall time, step boundary to step boundary)\n"
      "  step latency       p50 {:.2f} ms   p99 {:.2f} ms  (wall time)\n"
      "  wait for rows      p50 {:.2f} ms   p99 {:.2f} ms  (per layer, idle while rows travel)\n"
      "  wait for answers   p50 {:.2f} ms   p99 {:.2f} ms  (per layer, idle while only answers travel)\n"
      "  engine             {:.2f} ms per step: route {:.2f} | plan {:.2f} | experts {:.2f}{} | other {:.2f} | "
      "waits: rows {:.2f}, answers {:.2f} ms\n"
      "  activation rate    {:.1f}% ({:.2f} of {} experts per token per layer)\n"
      "  expert load        std/mean {:.2f}, hottest {:.2f}x mean (last {} steps)\n"
      "  bytes sent         same rank {} ({:.0f}%) | same island {} ({:.0f}%) | cross island {} "
      "({:.0f}%)\n",
      info_.ranks, info_.ranks == 1 ? "" : "s", info_.topology, info_.shape.describe(), served_,
      info_.tokens_per_step ? fmt::format("{} tokens", info_.tokens_per_step) : std::string("front-door rows"),
      info_.warmup_steps, info_.workload, info_.placement, info_.transport,
      info_.control == "transport" ? " (the control collectives too, after start-up)" : "", info_.blas, info_.numerics,
      info_.experts_device,
      s.tokens_per_s, s.step_p50_ms, s.step_p99_ms, s.rows_wait_p50_ms, s.rows_wait_p99_ms,
      s.answers_wait_p50_ms, s.answers_wait_p99_ms, s.engine_ms, s.route_ms, s.plan_ms, s.experts_ms,
      s.shared_ms > 0 ? fmt::format(" | shared {:.2f}", s.shared_ms) : std::string(), s.other_ms,
      s.rows_wait_ms, s.answers_wait_ms, 100 * s.activation_rate, s.experts_per_token, info_.shape.experts,
      s.load_std_over_mean, s.load_max_over_mean, std::min<std::uint64_t>(window_, s.measured_steps),
      human_bytes(double(s.bytes[0])), share(0), human_bytes(double(s.bytes[1])), share(1),
      human_bytes(double(s.bytes[2])), share(2));
  if (s.router_policies) {
    const RouterFigures& r = s.router;
    os << fmt::format("  router policies    {}: pairs dropped {:.2f}% ({:.2f}% of the gate weight), moved {:.2f}% "
                      "({:.2f}%)",
                      info_.router_policies, 100 * r.dropped_rate, 100 * r.weight_dropped, 100 * r.moved_rate,
                      100 * r.weight_moved);
    if (r.counts.selected) os << fmt::format("; {:.2f}% of the router's own pairs changed", 100 * r.changed_rate);
    os << "\n";
    if (r.counts.jitter_tested || r.counts.flip_tested)
      os << fmt::format("  routing jitter     {:.2f}% of tokens change experts under noise 1e-4, {:.2f}% under "
                        "1e-3; {:.2f}% flip from their request's previous position\n",
                        100 * r.jitter_rate[0], 100 * r.jitter_rate[1], 100 * r.flip_rate);
  }
  if (s.saturated)
    os << fmt::format("  WARNING            {} combine terms saturated the fixed-point range\n",
                      s.saturated);
  if (s.nonfinite) {
    constexpr std::size_t kListed = 8;
    std::string where;
    for (std::size_t i = 0; i < std::min(kListed, s.nonfinite_by_expert.size()); ++i) {
      const Summary::ExpertTerms& x = s.nonfinite_by_expert[i];
      where += fmt::format("{}layer {} expert {}: {}", i ? "; " : "", x.layer, x.expert, x.terms);
    }
    if (s.nonfinite_by_expert.size() > kListed)
      where += fmt::format("; {} more experts", s.nonfinite_by_expert.size() - kListed);
    os << fmt::format("  WARNING            {} expert output terms were NaN or inf, so those tokens' outputs "
                      "carry NaN ({})\n",
                      s.nonfinite, where);
  }
}

namespace {

nlohmann::json nonfinite_json(const Summary& s) {
  nlohmann::json list = nlohmann::json::array();
  for (const Summary::ExpertTerms& x : s.nonfinite_by_expert)
    list.push_back({{"layer", x.layer}, {"expert", x.expert}, {"terms", x.terms}});
  return list;
}

nlohmann::json router_json(const std::string& policies, const RouterFigures& r) {
  return {{"policies", policies},
          {"pairs", r.counts.pairs},
          {"pairs_dropped", r.counts.dropped},
          {"pairs_moved", r.counts.moved},
          {"dropped_rate", r.dropped_rate},
          {"moved_rate", r.moved_rate},
          {"weight_dropped", r.weight_dropped},
          {"weight_moved", r.weight_moved},
          {"pairs_selected", r.counts.selected},
          {"pairs_changed", r.counts.changed},
          {"changed_rate", r.changed_rate},
          {"flip_rate", r.flip_rate},
          {"flip_tested", r.counts.flip_tested},
          {"jitter_rate", {{"1e-4", r.jitter_rate[0]}, {"1e-3", r.jitter_rate[1]}}},
          {"jitter_tested", r.counts.jitter_tested}};
}

}  // namespace

nlohmann::json Report::window_load_json() const {
  // Per layer, each expert's pairs over the load window: what the load
  // spread figures are computed from.
  nlohmann::json layers = nlohmann::json::array();
  const std::size_t E = std::size_t(info_.shape.experts);
  for (std::size_t l = 0; l < std::size_t(info_.shape.layers); ++l)
    layers.push_back(std::vector<std::uint64_t>(window_load_.begin() + std::ptrdiff_t(l * E),
                                                window_load_.begin() + std::ptrdiff_t((l + 1) * E)));
  return layers;
}

nlohmann::json Report::to_json() const {
  Summary s = summary();
  using nlohmann::json;
  json bytes;
  for (int c = 0; c < placement::kLinkClasses; ++c)
    bytes[placement::to_string(placement::LinkClass(c))] = s.bytes[c];
  return json{
      {"ranks", info_.ranks},
      {"islands", info_.islands},
      {"layers", info_.shape.layers},
      {"experts", info_.shape.experts},
      {"top_k", info_.shape.top_k},
      {"hidden", info_.shape.hidden},
      {"ffn", info_.shape.ffn},
      {"tokens_per_step", info_.tokens_per_step},
      {"steps", served_},  // fewer than configured when moectl shutdown ended the run
      {"warmup_steps", info_.warmup_steps},
      {"measured_steps", s.measured_steps},
      {"transport", info_.transport},
      {"control", info_.control},
      {"workload", info_.workload},
      {"placement", info_.placement},
      {"batch_invariant", info_.batch_invariant},
      {"numerics", info_.numerics},
      {"experts_device", info_.experts_device},
      {"tokens_per_s", s.tokens_per_s},
      {"step_latency_ms", {{"p50", s.step_p50_ms}, {"p99", s.step_p99_ms}}},
      {"rows_wait_ms", {{"p50", s.rows_wait_p50_ms}, {"p99", s.rows_wait_p99_ms}}},
      {"answers_wait_ms", {{"p50", s.answers_wait_p50_ms}, {"p99", s.answers_wait_p99_ms}}},
      {"phase_ms",
       {{"engine", s.engine_ms},
        {"route", s.route_ms},
        {"plan", s.plan_ms},
        {"experts", s.experts_ms},
        {"shared", s.shared_ms},
        {"other", s.other_ms},
        {"rows_wait", s.rows_wait_ms},
        {"answers_wait", s.answers_wait_ms}}},
      {"bytes_copied_per_step", s.bytes_copied},
      {"activation_rate", s.activation_rate},
      {"experts_per_token", s.experts_per_token},
      {"rows_per_step", s.rows_per_step},
      {"expert_load_std_over_mean", s.load_std_over_mean},
      {"expert_load_max_over_mean", s.load_max_over_mean},
      {"load_window_steps", window_},
      {"retained_samples", retained_samples()},
      {"expert_load_window", window_load_json()},
      {"bytes_sent", bytes},
      {"fixed_point_saturated", s.saturated},
      {"nonfinite_terms", s.nonfinite},
      {"nonfinite_by_expert", nonfinite_json(s)},
      {"router_policies", router_json(info_.router_policies, s.router)},
  };
}

void Report::write_json(const std::string& path) const {
  write_file_atomically(path, to_json().dump(2) + "\n");
}

}  // namespace moed::runtime
