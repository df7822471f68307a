// The router policies on the Mixtral trace's expert popularity, offline: the
// trace fixes, per layer, how popular each expert is; tokens get logits
// log(popularity) + N(0, 1) noise (so the router's top-2 keeps the trace's
// skew), and the policies' pure functions (runtime/router_policies/) decide
// steps of them. Prints, per policy against none: expert load std/mean and
// max/mean (per step and layer, mean over the measured steps), the share of
// pairs moved or dropped (bias balancing: the router's own pairs its choice
// lost), and the gate-weight mass moved or dropped. No
// experts run here: step time is the daemon's (tests/bench/router_policies.sh).
//   bench_router_policies TRACE [--steps N] [--tokens T] [--warmup W]
#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "common/rng.h"
#include "common/summary_stats.h"
#include "routing/routing_trace.h"
#include "runtime/router.h"
#include "runtime/router_policies/bias_balancer.h"
#include "runtime/router_policies/load_policy.h"

using namespace moed;
using namespace moed::runtime;

namespace {

struct Policy {
  std::string name;
  LoadParams load;
  double gamma = 0;
};

struct Figures {
  double std_over_mean = 0, max_over_mean = 0, moved = 0, dropped = 0, weight_moved = 0, weight_dropped = 0;
};

Figures run(const Policy& p, const std::vector<std::vector<double>>& log_popularity, int experts, int steps,
            int warmup, std::size_t tokens) {
  const int L = int(log_popularity.size());
  RouterParams router;
  router.top_k = 2, router.max_k = 2;
  BiasBalancer bias(L, experts, p.gamma);
  const std::vector<std::uint32_t> replicas(std::size_t(experts), 1);
  Figures f;
  std::uint64_t pairs = 0, moved = 0, dropped = 0, weight_moved = 0, weight_dropped = 0;
  int measured = 0;
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
      rank_experts(logits.data(), p.gamma > 0 ? adjust.data() : nullptr, tokens, std::size_t(experts), router, 2,
                   ranked);
      Routing out;
      LoadOutcome o = apply_load_policy(ranked, replicas, p.load, 0, tokens, out);
      if (p.gamma > 0) {
        // Bias balancing moves pairs by changing the choice: count the
        // router's own pairs (without the bias) that the choice lost.
        Routing plain;
        route(logits.data(), tokens, std::size_t(experts), router, plain);
        for (std::size_t t = 0; t < tokens; ++t)
          for (std::size_t i = 0; i < plain.experts_of(t).size(); ++i) {
            const auto now = out.experts_of(t);
            if (std::find(now.begin(), now.end(), plain.experts_of(t)[i]) != now.end()) continue;
            ++o.moved;
            o.weight_moved += std::uint64_t(std::llround(double(plain.weights_of(t)[i]) * kWeightUnit));
          }
      }
      std::vector<std::uint64_t> load(std::size_t(experts), 0);
      for (std::uint32_t e : out.experts) ++load[e];
      bias.update(l, load);
      if (s < warmup) continue;
      const std::vector<double> d(load.begin(), load.end());
      f.std_over_mean += std_over_mean(d), f.max_over_mean += max_over_mean(d);
      ++measured;
      pairs += o.pairs, moved += o.moved, dropped += o.dropped;
      weight_moved += o.weight_moved, weight_dropped += o.weight_dropped;
    }
  f.std_over_mean /= measured, f.max_over_mean /= measured;
  f.moved = double(moved) / double(pairs), f.dropped = double(dropped) / double(pairs);
  const double token_layers = double(measured) * double(tokens);
  f.weight_moved = double(weight_moved) / kWeightUnit / token_layers;
  f.weight_dropped = double(weight_dropped) / kWeightUnit / token_layers;
  return f;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app("the router policies on the Mixtral trace's expert popularity (offline)");
  std::string trace_path;
  int steps = 64, warmup = 32;
  std::size_t tokens = 512;
  app.add_option("trace", trace_path, "routing trace (tests/data/mixtral-humaneval.trace)")->required();
  app.add_option("--steps", steps, "steps per layer");
  app.add_option("--warmup", warmup, "steps left out of the figures (bias balancing converging)");
  app.add_option("--tokens", tokens, "tokens per step");
  CLI11_PARSE(app, argc, argv);
  try {
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
        {"none", {LoadPolicy::none, 1, 1}},
        {"drop, capacity 1.0", {LoadPolicy::drop, 1.0, 1}},
        {"drop, capacity 1.25", {LoadPolicy::drop, 1.25, 1}},
        {"demote, 0.85 of capacity 1.25", {LoadPolicy::demote, 1.25, 0.85}},
        {"demote, 0.85 of capacity 1.5", {LoadPolicy::demote, 1.5, 0.85}},
        {"bias, gamma 0.001", {LoadPolicy::none, 1, 1}, 0.001},
        {"bias, gamma 0.01", {LoadPolicy::none, 1, 1}, 0.01},
        {"bias, gamma 0.05", {LoadPolicy::none, 1, 1}, 0.05},
    };
    fmt::print("{:<32} {:>9} {:>9} {:>9} {:>9} {:>12} {:>12}\n", "policy", "std/mean", "max/mean", "moved",
               "dropped", "weight moved", "weight dropped");
    for (const Policy& p : policies) {
      const Figures f = run(p, log_popularity, E, steps, warmup, tokens);
      fmt::print("{:<32} {:>9.3f} {:>9.2f} {:>8.2f}% {:>8.2f}% {:>11.2f}% {:>11.2f}%\n", p.name, f.std_over_mean,
                 f.max_over_mean, 100 * f.moved, 100 * f.dropped, 100 * f.weight_moved, 100 * f.weight_dropped);
    }
  } catch (const std::exception& e) {
    fmt::print(stderr, "bench_router_policies: {}\n", e.what());
    return 2;
  }
  return 0;
}
