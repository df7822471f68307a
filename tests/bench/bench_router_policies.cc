// The router policies on the Mixtral trace's expert popularity, offline: the
// trace fixes, per layer, how popular each expert is; tokens get logits
// log(popularity) + N(0, 1) noise (so the router's top-2 keeps the trace's
// skew), and the policies' pure functions (runtime/router/policies/) decide
// steps of them. Prints, per policy against none: expert load std/mean and
// max/mean (per step and layer, mean over the measured steps), the share of
// the router's own pairs changed (moved or dropped: those of the plain top-k
// the final routing lacks, as the daemon's changed_rate) and dropped, their
// gate-weight mass, and the lower bound: the fewest pairs ANY re-routing must
// move to bring none's loads to the target std/mean
// (runtime/router/policies/spread_bound.h). No experts run here: step time is
// the daemon's (tests/bench/router_policies.sh).
//   bench_router_policies TRACE [--steps N] [--tokens T] [--warmup W] [--target S]
//   bench_router_policies --bound-of REPORT.json [--target S | --at-share X]
//     the bound (a share of the pairs) for a daemon report's loads (its
//     expert_load_window, the loads its expert_load_std_over_mean is computed
//     from); with --at-share, the lowest std/mean moving that share can reach
#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/error.h"
#include "common/rng.h"
#include "common/summary_stats.h"
#include "routing/routing_trace.h"
#include "runtime/router/router.h"
#include "runtime/router/policies/bias_balancer.h"
#include "runtime/router/policies/load_policy.h"
#include "runtime/router/policies/router_policies.h"
#include "runtime/router/policies/spread_bound.h"

using namespace moed;
using namespace moed::runtime;

namespace {

struct Policy {
  std::string name;
  LoadParams load;
  double gamma = 0;
  std::size_t candidates = 2;  // with demotion: demotion_candidates (the default 2; 6 = every other expert)
};

struct Figures {
  double std_over_mean = 0, max_over_mean = 0, changed = 0, dropped = 0, weight_changed = 0, weight_dropped = 0;
  std::vector<std::vector<double>> loads;  // per measured (step, layer)
};

Figures run(const Policy& p, const std::vector<std::vector<double>>& log_popularity, int experts, int steps,
            int warmup, std::size_t tokens) {
  const int L = int(log_popularity.size());
  RouterParams router;
  router.top_k = 2, router.max_k = 2;
  BiasBalancer bias(L, experts, p.gamma);
  const std::vector<std::uint32_t> replicas(std::size_t(experts), 1);
  const std::size_t extra = p.load.policy == LoadPolicy::demote ? p.candidates : 0;
  Figures f;
  std::uint64_t pairs = 0, changed = 0, dropped = 0;
  double weight_changed = 0, weight_dropped = 0;
  std::vector<float> logits(tokens * std::size_t(experts));
  std::vector<double> adjust(tokens * std::size_t(experts));
  for (int s = 0; s < steps; ++s)
    for (int l = 0; l < L; ++l) {
      const CounterRng noise(hash_combine(std::uint64_t(s) * 4096 + std::uint64_t(l), 77));
      for (std::size_t i = 0; i < logits.size(); ++i)
        logits[i] = float(log_popularity[std::size_t(l)][i % std::size_t(experts)] + noise.normalish(i));
      for (std::size_t t = 0; t < tokens; ++t)
        for (int e = 0; e < experts; ++e) adjust[t * std::size_t(experts) + std::size_t(e)] = bias.layer(l)[std::size_t(e)];
      Ranked ranked;
      rank_experts(logits.data(), p.gamma > 0 ? adjust.data() : nullptr, tokens, std::size_t(experts), router, extra,
                   ranked);
      Routing out, plain;
      const LoadOutcome o = apply_load_policy(ranked, replicas, p.load, 0, tokens, out);
      route(logits.data(), tokens, std::size_t(experts), router, plain);
      std::vector<std::uint64_t> load(std::size_t(experts), 0), selected(std::size_t(experts), 0);
      for (std::uint32_t e : out.experts) ++load[e];
      for (std::size_t t = 0; t < tokens; ++t)
        for (std::uint32_t e : ranked.experts_of(t).first(ranked.chosen[t])) ++selected[e];
      // As the daemon: with a load policy, the bias follows the selection's loads before it.
      bias.update(l, p.load.policy == LoadPolicy::none ? load : selected);
      if (s < warmup) continue;
      std::vector<double> d(load.begin(), load.end());
      f.std_over_mean += std_over_mean(d), f.max_over_mean += max_over_mean(d);
      f.loads.push_back(std::move(d));
      pairs += plain.experts.size(), dropped += o.dropped;
      changed += lost_pairs(plain, out);
      weight_dropped += double(o.weight_dropped) / kWeightUnit;
      // The gate weight of the plain pairs the final routing lacks.
      for (std::size_t t = 0; t < tokens; ++t) {
        const auto now = out.experts_of(t);
        for (std::size_t i = 0; i < plain.experts_of(t).size(); ++i)
          if (std::find(now.begin(), now.end(), plain.experts_of(t)[i]) == now.end())
            weight_changed += plain.weights_of(t)[i];
      }
    }
  const double cells = double(f.loads.size()), token_layers = cells * double(tokens);
  f.std_over_mean /= cells, f.max_over_mean /= cells;
  f.changed = double(changed) / double(pairs), f.dropped = double(dropped) / double(pairs);
  f.weight_changed = weight_changed / token_layers, f.weight_dropped = weight_dropped / token_layers;
  return f;
}

// A daemon report's per-layer window loads (its expert_load_window).
std::vector<std::vector<double>> report_loads(const std::string& path) {
  std::ifstream in(path);
  if (!in.good()) MOED_THROW(Input, "cannot read the report {}", path);
  const nlohmann::json j = nlohmann::json::parse(in, nullptr, false);
  if (j.is_discarded() || !j.contains("expert_load_window"))
    MOED_THROW(Input, "{} is not a moed report with expert_load_window", path);
  return j["expert_load_window"].get<std::vector<std::vector<double>>>();
}

// The lowest mean std/mean that moving `share` of the pairs can reach: the
// target whose bound is that share (the bound falls as the target rises).
double best_spread_at(const std::vector<std::vector<double>>& cells, double share) {
  double lo = 0, hi = 0;
  for (const auto& c : cells) hi = std::max(hi, std_over_mean(c));
  for (int i = 0; i < 60; ++i) {
    const double mid = (lo + hi) / 2;
    (min_moves_for_spread(cells, mid).share() > share ? lo : hi) = mid;
  }
  return hi;
}

void offline(const std::string& trace_path, int steps, int warmup, std::size_t tokens, double target) {
  const routing::RoutingTrace trace = routing::read_trace(trace_path);
  const int E = trace.experts();
  std::vector<std::vector<double>> log_popularity(std::size_t(trace.layers()), std::vector<double>(std::size_t(E)));
  double hot = 0;
  for (int l = 0; l < trace.layers(); ++l) {
    std::vector<double> count(std::size_t(E), 0.5);  // +0.5: no expert at log(0)
    for (std::size_t t = 0; t < trace.tokens(); ++t)
      for (const auto& c : trace.at(t, l)) count[c.expert] += 1;
    hot += max_over_mean(count) / trace.layers();
    for (int e = 0; e < E; ++e) log_popularity[std::size_t(l)][std::size_t(e)] = std::log(count[std::size_t(e)]);
  }
  fmt::print("Mixtral trace popularity: {} layers x {} experts, hottest expert {:.2f}x mean (trace, mean over "
             "layers); {} steps of {} tokens, {} measured\n",
             trace.layers(), E, hot, steps, tokens, steps - warmup);
  const std::vector<Policy> policies = {
      {"none", {LoadPolicy::none, 1, 1, {}}},
      {"drop, capacity 1.0", {LoadPolicy::drop, 1.0, 1, {}}},
      {"drop, capacity 1.25", {LoadPolicy::drop, 1.25, 1, {}}},
      {"demote, 0.85 of capacity 1.25", {LoadPolicy::demote, 1.25, 0.85, {}}},
      {"demote, 0.85 of capacity 1.5", {LoadPolicy::demote, 1.5, 0.85, {}}},
      {"demote, 1.0 of capacity 1.1", {LoadPolicy::demote, 1.1, 1.0, {}}},
      {"demote, 1.0 of capacity 1.0", {LoadPolicy::demote, 1.0, 1.0, {}}},
      {"bias, gamma 0.001", {LoadPolicy::none, 1, 1, {}}, 0.001},
      {"bias, gamma 0.01", {LoadPolicy::none, 1, 1, {}}, 0.01},
      {"bias, gamma 0.05", {LoadPolicy::none, 1, 1, {}}, 0.05},
      {"bias 0.01 + demote 1.0 of 1.1", {LoadPolicy::demote, 1.1, 1.0, {}}, 0.01},
      {"bias 0.01 + demote 1.0 of 1.0", {LoadPolicy::demote, 1.0, 1.0, {}}, 0.01},
      {"demote to 0.10", {LoadPolicy::demote, 1, 1, {}, 0.10}},
      {"demote to 0.10, 6 candidates", {LoadPolicy::demote, 1, 1, {}, 0.10}, 0, 6},
      {"demote to 0.09, 6 candidates", {LoadPolicy::demote, 1, 1, {}, 0.09}, 0, 6},
      {"bias 0.01 + demote to 0.10, 6 cand.", {LoadPolicy::demote, 1, 1, {}, 0.10}, 0.01, 6},
      {"bias 0.001 + demote to 0.10, 6 cand.", {LoadPolicy::demote, 1, 1, {}, 0.10}, 0.001, 6},
  };
  fmt::print("{:<38} {:>9} {:>9} {:>9} {:>9} {:>12} {:>12} {:>9}\n", "policy", "std/mean", "max/mean", "changed",
             "dropped", "weight chg", "weight drop", "bound");
  std::vector<std::vector<double>> none;
  for (const Policy& p : policies) {
    const Figures f = run(p, log_popularity, E, steps, warmup, tokens);
    if (p.name == "none") none = f.loads;
    // The fewest pairs that could have reached this policy's own spread.
    const double own = min_moves_for_spread(none, f.std_over_mean).share();
    fmt::print("{:<38} {:>9.3f} {:>9.2f} {:>8.2f}% {:>8.2f}% {:>11.2f}% {:>11.2f}% {:>8.2f}%\n", p.name,
               f.std_over_mean, f.max_over_mean, 100 * f.changed, 100 * f.dropped, 100 * f.weight_changed,
               100 * f.weight_dropped, 100 * own);
  }
  fmt::print("bound: the fewest pairs any re-routing of none's loads (per step and layer) must move to reach the "
             "policy's std/mean; to reach {}: {:.2f}%; moving 5% reaches {:.3f} at best\n",
             target, 100 * min_moves_for_spread(none, target).share(), best_spread_at(none, 0.05));
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app("the router policies on the Mixtral trace's expert popularity (offline)");
  std::string trace_path, report_path;
  int steps = 64, warmup = 32;
  std::size_t tokens = 512;
  double target = 0.10;
  app.add_option("trace", trace_path, "routing trace (tests/data/mixtral-humaneval.trace)");
  app.add_option("--bound-of", report_path, "print only the bound for this daemon report's window loads");
  app.add_option("--steps", steps, "steps per layer")->check(CLI::PositiveNumber);
  app.add_option("--warmup", warmup, "steps left out of the figures (bias balancing converging)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--tokens", tokens, "tokens per step")->check(CLI::PositiveNumber);
  double at_share = -1;
  app.add_option("--target", target, "the load std/mean the bound is for (the issue's aim: 0.10)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--at-share", at_share, "with --bound-of: print the lowest std/mean moving this share reaches")
      ->check(CLI::Range(0.0, 1.0));
  CLI11_PARSE(app, argc, argv);
  if (trace_path.empty() == report_path.empty() || warmup >= steps) {
    fmt::print(stderr, "bench_router_policies: give a trace or --bound-of REPORT (one of them), and --warmup under "
                       "--steps\n");
    return 2;
  }
  try {
    if (!report_path.empty()) {
      const auto loads = report_loads(report_path);
      if (at_share >= 0)
        fmt::print("{:.4f}\n", best_spread_at(loads, at_share));
      else
        fmt::print("{:.4f}\n", min_moves_for_spread(loads, target).share());
      return 0;
    }
    offline(trace_path, steps, warmup, tokens, target);
  } catch (const std::exception& e) {
    fmt::print(stderr, "bench_router_policies: {}\n", e.what());
    return 2;
  }
  return 0;
}
