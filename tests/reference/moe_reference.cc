// moe_reference: an independent, single-process, plain-loop computation of
// what moed serves, in double precision, compared against a moed output dump.
//
// It shares only the inputs with moed (config, weights, workload tokens): no
// BLAS, no dispatch plan, no fixed point. moed computes in fp32 with blocked
// GEMMs, so the two agree within a tolerance, not bitwise; tokens whose
// routing is a near-tie at some layer (top-k margin below 1e-5 in probability)
// may legitimately route differently and are counted and skipped.
#include <CLI/CLI.hpp>

#include <algorithm>
#include <cmath>
#include <iostream>
#include <numeric>

#include "common/error.h"
#include "routing/routing_trace.h"
#include "runtime/config/config.h"
#include "runtime/weights/model.h"
#include "runtime/daemon/output_dump.h"
#include "runtime/weights/safetensors.h"
#include "runtime/weights/synthetic_model.h"
#include "runtime/workload/workload.h"

namespace {

using namespace moed::runtime;

struct Layer {
  std::vector<float> gate, norm;
  std::vector<std::vector<float>> w1, w2, w3;
};

std::vector<Layer> load_model(const Config& c, const ModelShape& s) {
  auto dtype = *moed::weights::parse_dtype(c.model.dtype);
  SyntheticModel synthetic{s, std::uint64_t(c.model.seed), dtype};
  std::unique_ptr<moed::weights::Checkpoint> ck;
  if (!c.model.weights.empty()) ck = std::make_unique<moed::weights::Checkpoint>(c.model.weights);
  auto get = [&](const std::string& name, const std::vector<std::int64_t>& dims, auto&& synth) {
    std::vector<float> v(std::size_t(std::accumulate(dims.begin(), dims.end(), std::int64_t{1}, std::multiplies<>())));
    if (ck) ck->read_f32(name, dtype, dims, v.data());
    else synth(v.data());
    return v;
  };
  std::vector<Layer> layers(s.layers);
  for (int l = 0; l < s.layers; ++l) {
    Layer& L = layers[l];
    L.gate = get(gate_tensor(l), gate_shape(s), [&](float* p) { synthetic.gate(l, p); });
    L.norm = get(norm_tensor(l), norm_shape(s), [&](float* p) { synthetic.norm(l, p); });
    for (int e = 0; e < s.experts; ++e) {
      L.w1.push_back(get(expert_tensor(l, e, "w1"), up_shape(s), [&](float* p) { synthetic.up(l, e, 1, p); }));
      L.w2.push_back(get(expert_tensor(l, e, "w2"), down_shape(s), [&](float* p) { synthetic.down(l, e, p); }));
      L.w3.push_back(get(expert_tensor(l, e, "w3"), up_shape(s), [&](float* p) { synthetic.up(l, e, 3, p); }));
    }
  }
  return layers;
}

struct Choice {
  int expert;
  double weight;
};

// Softmax with temperature, then top-k or top-p; `ambiguous` when the cut is a near-tie.
std::vector<Choice> route_token(const std::vector<double>& logits, const Config& c, bool& ambiguous) {
  const int E = int(logits.size());
  std::vector<double> p(E);
  double mx = *std::max_element(logits.begin(), logits.end()), sum = 0;
  for (int e = 0; e < E; ++e) sum += p[e] = std::exp((logits[e] - mx) / c.router.temperature);
  for (double& v : p) v /= sum;
  std::vector<int> order(E);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return p[a] > p[b]; });
  int k = int(c.model.top_k);
  if (c.router.mode == RouterMode::topp) {
    int max_k = int(c.router.max_k ? c.router.max_k : c.model.top_k);
    double mass = 0;
    k = 0;
    while (k < max_k && (k < c.router.min_k || mass < c.router.top_p)) mass += p[order[k++]];
    if (std::abs(mass - p[order[k - 1]] - c.router.top_p) < 1e-5 || std::abs(mass - c.router.top_p) < 1e-5)
      ambiguous = true;
  }
  if (k < E && p[order[k - 1]] - p[order[k]] < 1e-5) ambiguous = true;
  double chosen = 0;
  for (int i = 0; i < k; ++i) chosen += p[order[i]];
  std::vector<Choice> out;
  for (int i = 0; i < k; ++i) out.push_back({order[i], p[order[i]] / chosen});
  return out;
}

// One token through one MoE layer, in double.
void layer_forward(const Layer& L, const ModelShape& s, const Config& c, std::vector<double>& x,
                   const std::vector<Choice>* replayed, bool& ambiguous) {
  const int H = s.hidden, F = s.ffn;
  double ss = 0;
  for (double v : x) ss += v * v;
  double inv = 1.0 / std::sqrt(ss / H + c.model.norm_eps);
  std::vector<double> xn(H);
  for (int i = 0; i < H; ++i) xn[i] = x[i] * inv * L.norm[i];

  std::vector<Choice> choices;
  if (replayed) {
    choices = *replayed;
  } else {
    std::vector<double> logits(s.experts, 0.0);
    for (int e = 0; e < s.experts; ++e)
      for (int i = 0; i < H; ++i) logits[e] += xn[i] * L.gate[std::size_t(e) * H + i];
    choices = route_token(logits, c, ambiguous);
  }
  std::vector<double> out(H, 0.0), act(F);
  for (const Choice& ch : choices) {
    const auto &w1 = L.w1[ch.expert], &w2 = L.w2[ch.expert], &w3 = L.w3[ch.expert];
    for (int f = 0; f < F; ++f) {
      double g = 0, u = 0;
      for (int i = 0; i < H; ++i) {
        g += w1[std::size_t(f) * H + i] * xn[i];
        u += w3[std::size_t(f) * H + i] * xn[i];
      }
      act[f] = g / (1.0 + std::exp(-g)) * u;
    }
    for (int i = 0; i < H; ++i) {
      double y = 0;
      for (int f = 0; f < F; ++f) y += w2[std::size_t(i) * F + f] * act[f];
      out[i] += ch.weight * y;
    }
  }
  for (int i = 0; i < H; ++i) x[i] += out[i];
}

}  // namespace

int main(int argc, char** argv) {
  std::string config_path, dump_path;
  std::vector<std::string> overrides;
  double atol = 1e-4, rtol = 1e-4, max_ambiguous = 0.01;
  CLI::App app{"moe_reference: checks a moed --dump-output against plain double-precision loops"};
  app.add_option("-c,--config", config_path, "moed config file");
  app.add_option("--set", overrides, "config override section.key=value (repeatable)");
  app.add_option("--dump", dump_path, "moed --dump-output file to check")->required();
  app.add_option("--atol", atol, "absolute tolerance");
  app.add_option("--rtol", rtol, "relative tolerance");
  app.add_option("--max-ambiguous", max_ambiguous, "largest share of near-tie tokens accepted");
  CLI11_PARSE(app, argc, argv);
  try {
    Config c = load_config(config_path, overrides);
    ModelShape s = ModelShape::from(c.model);
    std::vector<Layer> model = load_model(c, s);
    auto workload = make_workload(c, model[0].gate.data());
    OutputFile dump = read_output_dump(dump_path);
    const std::uint64_t N = std::uint64_t(c.workload.tokens_per_step), steps = std::uint64_t(c.workload.steps);
    if (dump.header.hidden != std::uint64_t(s.hidden) || dump.header.tokens_per_step != N ||
        dump.header.steps != steps)
      MOED_THROW(Input, "{}: dump is {} steps x {} tokens x {} hidden, config says {} x {} x {}",
                 dump_path, dump.header.steps, dump.header.tokens_per_step, dump.header.hidden,
                 steps, N, s.hidden);

    std::uint64_t ambiguous_tokens = 0, bad = 0, checked = 0;
    double max_abs = 0, max_rel = 0;
    std::vector<float> x0(s.hidden);
    for (std::uint64_t id = 0; id < N * steps; ++id) {
      workload->tokens(id, 1, x0.data());
      std::vector<double> x(x0.begin(), x0.end());
      bool ambiguous = false;
      for (int l = 0; l < s.layers; ++l) {
        if (workload->replays_routing()) {
          Routing r;
          workload->routing(id, 1, l, r);
          std::vector<Choice> replayed;
          for (std::size_t i = 0; i < r.pairs(); ++i) replayed.push_back({int(r.experts[i]), r.weights[i]});
          layer_forward(model[l], s, c, x, &replayed, ambiguous);
        } else {
          layer_forward(model[l], s, c, x, nullptr, ambiguous);
        }
      }
      if (ambiguous) {
        ++ambiguous_tokens;
        continue;
      }
      ++checked;
      const float* got = dump.rows.data() + id * s.hidden;
      for (int i = 0; i < s.hidden; ++i) {
        double diff = std::abs(double(got[i]) - x[i]);
        max_abs = std::max(max_abs, diff);
        max_rel = std::max(max_rel, diff / std::max(std::abs(x[i]), 1e-30));
        if (!(diff <= atol + rtol * std::abs(x[i]))) ++bad;
      }
    }
    double share = double(ambiguous_tokens) / double(N * steps);
    std::cout << fmt::format(
        "moe_reference: {} tokens checked, {} near-tie tokens skipped ({:.2f}%), max |diff| {:.3g}, "
        "{} elements beyond atol {} + rtol {}\n",
        checked, ambiguous_tokens, 100 * share, max_abs, bad, atol, rtol);
    return bad == 0 && share <= max_ambiguous ? 0 : 1;
  } catch (const moed::Error& e) {
    std::cerr << "moe_reference: " << e.describe() << "\n";
    return 2;
  }
}
