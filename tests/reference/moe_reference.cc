// moe_reference: an independent, single-process, plain-loop computation of
// what moed serves, in double precision, compared against a moed output dump.
//
// It shares only the inputs with moed (config, weights, workload tokens): no
// BLAS, no dispatch plan, no fixed point. moed computes in fp32 with blocked
// GEMMs, so the two agree within a tolerance, not bitwise; tokens whose
// routing is a near-tie at some layer (top-k margin below 1e-5 in probability)
// may legitimately route differently and are counted and skipped. Every
// family's router and experts are written here from the formulas of
// docs/model-families.md, apart from moed's own code.
#include <CLI/CLI.hpp>

#include <algorithm>
#include <cmath>
#include <iostream>
#include <numeric>

#include "common/error.h"
#include "kernels/cpu/encoded_matrix.h"
#include "routing/routing_trace.h"
#include "runtime/config/config.h"
#include "runtime/weights/expert_store.h"
#include "runtime/weights/model.h"
#include "runtime/daemon/output_dump.h"
#include "runtime/weights/safetensors.h"
#include "runtime/weights/synthetic_model.h"
#include "runtime/workload/workload.h"

namespace {

using namespace moed::runtime;

// One expert in plain torch Linear layout: w1 (gate), w3 (up) [F, H], w2 [H, F];
// biases b1, b3 [F], b2 [H] (gpt-oss), empty otherwise.
struct Expert {
  std::vector<float> w1, w3, w2, b1, b3, b2;
};

struct Layer {
  std::vector<float> gate, norm, gate_bias, selection_bias, shared_gate;
  std::vector<Expert> experts;
  Expert shared;  // w1 empty: none
};

// [experts].dtype other than f32: each expert matrix as the format holds
// it, w = value(code) read one weight at a time (EncodedMatrix::value, the
// plain definition; moed's GEMM decodes panels with vector code instead).
// The reference computes in double on these values. Checkpoints shipping
// fp8 or mxfp4 are not read here: their synthetic model in memory is.
void hold_in_format(const Config& c, const ModelShape& s, Expert& x) {
  moed::kernels::WeightDtype held = moed::kernels::WeightDtype::f32;
  moed::kernels::parse_weight_dtype(moed::runtime::experts_dtype(c), &held);
  if (held == moed::kernels::WeightDtype::f32 || x.w1.empty()) return;
  if (!c.model.checkpoint_experts.empty())
    throw std::runtime_error("moe_reference: a checkpoint in " + c.model.checkpoint_experts +
                             " is checked through its synthetic model in memory");
  const std::size_t H = std::size_t(s.hidden), F = x.w1.size() / H;
  auto held_values = [&](std::vector<float>& w, std::size_t n, std::size_t k) {
    const moed::kernels::EncodedMatrix m = moed::kernels::encode(held, w.data(), n, k);
    for (std::size_t i = 0; i < n; ++i)
      for (std::size_t j = 0; j < k; ++j) w[i * k + j] = m.value(i, j);
  };
  held_values(x.w1, F, H);
  held_values(x.w3, F, H);
  held_values(x.w2, H, F);
}

std::size_t numel(const std::vector<std::int64_t>& dims) {
  return std::size_t(std::accumulate(dims.begin(), dims.end(), std::int64_t{1}, std::multiplies<>()));
}

// Every tensor of every MoE layer, read by the family's own names (gpt-oss's
// fused tensors whole, then cut here), or made by the synthetic model.
std::vector<Layer> load_model(const Config& c, const ModelShape& s) {
  auto dtype = *moed::weights::parse_dtype(c.model.dtype);
  SyntheticModel synthetic{s, std::uint64_t(c.model.seed), dtype};
  std::unique_ptr<moed::weights::Checkpoint> ck;
  if (!c.model.weights.empty()) ck = std::make_unique<moed::weights::Checkpoint>(c.model.weights);
  auto get = [&](const std::string& name, const std::vector<std::int64_t>& dims, auto&& synth) {
    std::vector<float> v(numel(dims));
    if (ck) ck->read_f32(name, dtype, dims, v.data());
    else synth(v.data());
    return v;
  };
  const ModelSpec& spec = s.spec;
  const TensorNames names(spec.family);
  const std::int64_t E = s.experts, H = s.hidden, F = s.ffn, Fs = spec.shared_ffn;
  std::vector<Layer> layers(s.layers);
  for (int i = 0; i < s.layers; ++i) {
    const int l = spec.model_layer(i);
    Layer& L = layers[i];
    L.gate = get(names.gate(l), {E, H}, [&](float* p) { synthetic.gate(l, p); });
    L.norm = get(names.norm(l), {H}, [&](float* p) { synthetic.norm(l, p); });
    if (spec.router.gate_bias)
      L.gate_bias = get(names.gate_bias(l), {E}, [&](float* p) { synthetic.gate_bias(l, p); });
    if (spec.router.selection_bias)
      L.selection_bias = get(names.selection_bias(l), {E}, [&](float* p) { synthetic.selection_bias(l, p); });
    if (spec.family == Family::gpt_oss) {
      // Fused: gate_up_proj [E, H, 2F] with gate, up interleaved; down_proj [E, F, H].
      std::vector<float> gu, gub, down, downb;
      if (ck) {
        gu = get(names.fused(l, "gate_up_proj"), {E, H, 2 * F}, [](float*) {});
        gub = get(names.fused(l, "gate_up_proj_bias"), {E, 2 * F}, [](float*) {});
        down = get(names.fused(l, "down_proj"), {E, F, H}, [](float*) {});
        downb = get(names.fused(l, "down_proj_bias"), {E, H}, [](float*) {});
      }
      for (int e = 0; e < E; ++e) {
        Expert x{std::vector<float>(std::size_t(F * H)), std::vector<float>(std::size_t(F * H)),
                 std::vector<float>(std::size_t(H * F)), std::vector<float>(std::size_t(F)),
                 std::vector<float>(std::size_t(F)), std::vector<float>(std::size_t(H))};
        if (ck) {
          for (std::int64_t f = 0; f < F; ++f) {
            for (std::int64_t h = 0; h < H; ++h) {
              x.w1[std::size_t(f * H + h)] = gu[std::size_t((e * H + h) * 2 * F + 2 * f)];
              x.w3[std::size_t(f * H + h)] = gu[std::size_t((e * H + h) * 2 * F + 2 * f + 1)];
              x.w2[std::size_t(h * F + f)] = down[std::size_t((e * F + f) * H + h)];
            }
            x.b1[std::size_t(f)] = gub[std::size_t(e * 2 * F + 2 * f)];
            x.b3[std::size_t(f)] = gub[std::size_t(e * 2 * F + 2 * f + 1)];
          }
          std::copy_n(downb.begin() + e * H, H, x.b2.begin());
        } else {
          synthetic.up(l, e, 1, x.w1.data());
          synthetic.up(l, e, 3, x.w3.data());
          synthetic.down(l, e, x.w2.data());
          synthetic.expert_bias(l, e, 1, x.b1.data());
          synthetic.expert_bias(l, e, 3, x.b3.data());
          synthetic.expert_bias(l, e, 2, x.b2.data());
        }
        L.experts.push_back(std::move(x));
      }
    } else {
      for (int e = 0; e < E; ++e)
        L.experts.push_back(
            {get(names.expert(l, e, ExpertPart::gate), {F, H}, [&](float* p) { synthetic.up(l, e, 1, p); }),
             get(names.expert(l, e, ExpertPart::up), {F, H}, [&](float* p) { synthetic.up(l, e, 3, p); }),
             get(names.expert(l, e, ExpertPart::down), {H, F}, [&](float* p) { synthetic.down(l, e, p); }),
             {}, {}, {}});
    }
    if (Fs) {
      L.shared.w1 = get(names.shared(l, ExpertPart::gate), {Fs, H}, [&](float* p) { synthetic.shared(l, ExpertPart::gate, p); });
      L.shared.w3 = get(names.shared(l, ExpertPart::up), {Fs, H}, [&](float* p) { synthetic.shared(l, ExpertPart::up, p); });
      L.shared.w2 = get(names.shared(l, ExpertPart::down), {H, Fs}, [&](float* p) { synthetic.shared(l, ExpertPart::down, p); });
      if (spec.shared_gated)
        L.shared_gate = get(names.shared_gate(l), {1, H}, [&](float* p) { synthetic.shared_gate(l, p); });
    }
  }
  return layers;
}

// A dense layer served ([model].serve_dense): its norm and FFN, by model layer number.
struct Dense {
  int model_layer;
  std::vector<float> norm;
  Expert ffn;
};

std::vector<Dense> load_dense(const Config& c, const ModelShape& s) {
  std::vector<Dense> out;
  if (!c.model.serve_dense) return out;
  auto dtype = *moed::weights::parse_dtype(c.model.dtype);
  SyntheticModel synthetic{s, std::uint64_t(c.model.seed), dtype};
  std::unique_ptr<moed::weights::Checkpoint> ck;
  if (!c.model.weights.empty()) ck = std::make_unique<moed::weights::Checkpoint>(c.model.weights);
  const TensorNames names(s.spec.family);
  const std::int64_t H = s.hidden, Fd = s.spec.dense_ffn;
  auto get = [&](const std::string& name, const std::vector<std::int64_t>& dims, auto&& synth) {
    std::vector<float> v(numel(dims));
    if (ck) ck->read_f32(name, dtype, dims, v.data());
    else synth(v.data());
    return v;
  };
  for (int l : s.spec.dense_layers()) {
    Dense d{l, get(names.norm(l), {H}, [&](float* p) { synthetic.norm(l, p); }), {}};
    d.ffn.w1 = get(names.dense(l, ExpertPart::gate), {Fd, H}, [&](float* p) { synthetic.dense(l, ExpertPart::gate, p); });
    d.ffn.w3 = get(names.dense(l, ExpertPart::up), {Fd, H}, [&](float* p) { synthetic.dense(l, ExpertPart::up, p); });
    d.ffn.w2 = get(names.dense(l, ExpertPart::down), {H, Fd}, [&](float* p) { synthetic.dense(l, ExpertPart::down, p); });
    out.push_back(std::move(d));
  }
  return out;
}

struct Choice {
  int expert;
  double weight;
};

constexpr double kNearTie = 1e-5;

// The experts of `order` sorted by `key`, descending, ties to the lower id.
std::vector<int> ranked(const std::vector<double>& key, std::vector<int> order) {
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return key[a] > key[b]; });
  return order;
}

// The table, row by row, in double: `ambiguous` when a cut (the
// k-th expert, the kept groups, top-p's mass) is a near-tie.
std::vector<Choice> route_token(std::vector<double> logits, const Layer& L, const ModelSpec& spec, const Config& c,
                                bool& ambiguous) {
  const RouterSpec& r = spec.router;
  const int E = int(logits.size());
  int k = int(c.model.top_k);
  std::vector<int> all(E);
  std::iota(all.begin(), all.end(), 0);
  if (r.gate_bias)
    for (int e = 0; e < E; ++e) logits[e] += L.gate_bias[e];
  if (r.softmax_after_topk) {  // gpt-oss: the top-k logits, then their softmax
    std::vector<int> order = ranked(logits, all);
    if (logits[order[k - 1]] - logits[order[k]] < kNearTie) ambiguous = true;
    double mx = logits[order[0]], sum = 0;
    for (int i = 0; i < k; ++i) sum += std::exp(logits[order[i]] - mx);
    std::vector<Choice> out;
    for (int i = 0; i < k; ++i) out.push_back({order[i], std::exp(logits[order[i]] - mx) / sum});
    return out;
  }
  std::vector<double> score(E);
  if (r.scoring == Scoring::sigmoid) {
    for (int e = 0; e < E; ++e) score[e] = 1 / (1 + std::exp(-logits[e]));
  } else {
    double mx = *std::max_element(logits.begin(), logits.end()), sum = 0;
    for (int e = 0; e < E; ++e) sum += score[e] = std::exp((logits[e] - mx) / c.router.temperature);
    for (double& v : score) v /= sum;
  }
  std::vector<double> select = score;
  if (r.selection_bias)
    for (int e = 0; e < E; ++e) select[e] += L.selection_bias[e];
  std::vector<int> candidates = all;
  if (r.groups > 1) {
    const int per = E / r.groups;
    std::vector<double> group_score(r.groups);
    for (int g = 0; g < r.groups; ++g) {
      std::vector<double> members(select.begin() + g * per, select.begin() + (g + 1) * per);
      std::sort(members.rbegin(), members.rend());
      group_score[g] = r.selection_bias ? members[0] + members[1] : members[0];
    }
    std::vector<int> groups(r.groups);
    std::iota(groups.begin(), groups.end(), 0);
    groups = ranked(group_score, groups);
    if (r.groups_kept < r.groups &&
        group_score[groups[r.groups_kept - 1]] - group_score[groups[r.groups_kept]] < kNearTie)
      ambiguous = true;
    candidates.clear();
    for (int i = 0; i < r.groups_kept; ++i)
      for (int e = groups[i] * per; e < (groups[i] + 1) * per; ++e) candidates.push_back(e);
  }
  std::vector<int> order = ranked(select, candidates);
  if (c.router.mode == RouterMode::topp) {
    int max_k = int(c.router.max_k ? c.router.max_k : c.model.top_k);
    double mass = 0;
    k = 0;
    while (k < max_k && (k < c.router.min_k || mass < c.router.top_p)) mass += score[order[k++]];
    if (std::abs(mass - score[order[k - 1]] - c.router.top_p) < kNearTie || std::abs(mass - c.router.top_p) < kNearTie)
      ambiguous = true;
  }
  if (std::size_t(k) < order.size() && select[order[k - 1]] - select[order[k]] < kNearTie) ambiguous = true;
  double chosen = 0;
  for (int i = 0; i < k; ++i) chosen += score[order[i]];
  std::vector<Choice> out;
  for (int i = 0; i < k; ++i) out.push_back({order[i], (r.renormalize ? score[order[i]] / chosen : score[order[i]]) * r.scaling});
  return out;
}

double sigmoid(double v) { return 1 / (1 + std::exp(-v)); }

// What a compact expert's GEMMs read ([experts].products): bf16 and amx round
// each value (fp32, then bf16); int8 quantizes each GEMM's input row (the
// input over H; the activation over each canonical chunk of F) to 8 bits:
// q = round(v 127 / amax), then q amax / 127. The reference does the same
// to its doubles; the rest stays in double.
moed::kernels::CompactProducts g_products = moed::kernels::CompactProducts::f32;
void as_gemm_input(double* v, std::size_t n) {
  using moed::kernels::CompactProducts;
  if (g_products == CompactProducts::bf16 || g_products == CompactProducts::amx)
    for (std::size_t i = 0; i < n; ++i) v[i] = double(moed::kernels::bf16_value(moed::kernels::bf16_code(float(v[i]))));
  if (g_products != CompactProducts::int8) return;
  double amax = 0;
  for (std::size_t i = 0; i < n; ++i) amax = std::max(amax, std::abs(v[i]));
  for (std::size_t i = 0; i < n; ++i) v[i] = amax > 0 ? std::nearbyint(v[i] * 127 / amax) * amax / 127 : 0;
}

// y = W2 act(W1 x + b1, W3 x + b3) + b2: SwiGLU, or gpt-oss's clamped form;
// act's GEMM input in `chunks` canonical chunks.
std::vector<double> expert_forward(const Expert& w, const ExpertSpec& spec, const std::vector<double>& x_in,
                                   std::size_t chunks = 1) {
  std::vector<double> xn = x_in;
  as_gemm_input(xn.data(), xn.size());
  const std::size_t H = xn.size(), F = w.w1.size() / H;
  std::vector<double> act(F), y(H, 0.0);
  for (std::size_t f = 0; f < F; ++f) {
    double g = w.b1.empty() ? 0 : w.b1[f], u = w.b3.empty() ? 0 : w.b3[f];
    for (std::size_t i = 0; i < H; ++i) {
      g += w.w1[f * H + i] * xn[i];
      u += w.w3[f * H + i] * xn[i];
    }
    if (spec.activation == Activation::clamped_swiglu) {
      g = std::min(g, spec.limit);
      u = std::clamp(u, -spec.limit, spec.limit);
      act[f] = g * sigmoid(spec.alpha * g) * (u + 1);
    } else {
      act[f] = g * sigmoid(g) * u;
    }
  }
  for (std::size_t chunk = 0; chunk < chunks; ++chunk) as_gemm_input(act.data() + chunk * F / chunks, F / chunks);
  for (std::size_t i = 0; i < H; ++i) {
    y[i] = w.b2.empty() ? 0 : w.b2[i];
    for (std::size_t f = 0; f < F; ++f) y[i] += w.w2[i * F + f] * act[f];
  }
  return y;
}

// One token through one MoE layer, in double.
std::vector<double> rms_norm(const std::vector<double>& x, const std::vector<float>& weight, double eps) {
  const std::size_t H = x.size();
  double ss = 0;
  for (double v : x) ss += v * v;
  const double inv = 1.0 / std::sqrt(ss / double(H) + eps);
  std::vector<double> xn(H);
  for (std::size_t i = 0; i < H; ++i) xn[i] = x[i] * inv * weight[i];
  return xn;
}

// A dense layer: x + FFN(RMSNorm(x)), the FFN a plain SwiGLU.
void dense_forward(const Dense& d, const Config& c, std::vector<double>& x) {
  const std::vector<double> y = expert_forward(d.ffn, ExpertSpec{}, rms_norm(x, d.norm, c.model.norm_eps));
  for (std::size_t i = 0; i < x.size(); ++i) x[i] += y[i];
}

void layer_forward(const Layer& L, const ModelShape& s, const Config& c, std::vector<double>& x,
                   const std::vector<Choice>* replayed, bool& ambiguous) {
  const int H = s.hidden;
  const std::vector<double> xn = rms_norm(x, L.norm, c.model.norm_eps);

  std::vector<Choice> choices;
  if (replayed) {
    choices = *replayed;
  } else {
    std::vector<double> logits(s.experts, 0.0);
    for (int e = 0; e < s.experts; ++e)
      for (int i = 0; i < H; ++i) logits[e] += xn[i] * L.gate[std::size_t(e) * H + i];
    choices = route_token(logits, L, s.spec, c, ambiguous);
  }
  std::vector<double> out(H, 0.0);
  for (const Choice& ch : choices) {
    const std::vector<double> y =
        expert_forward(L.experts[ch.expert], s.spec.expert, xn, std::size_t(c.experts.ffn_chunks));
    for (int i = 0; i < H; ++i) out[i] += ch.weight * y[i];
  }
  if (!L.shared.w1.empty()) {
    double weight = 1;
    if (!L.shared_gate.empty()) {
      double g = 0;
      for (int i = 0; i < H; ++i) g += L.shared_gate[i] * xn[i];
      weight = sigmoid(g);
    }
    const std::vector<double> y = expert_forward(L.shared, ExpertSpec{}, xn);
    for (int i = 0; i < H; ++i) out[i] += weight * y[i];
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
    std::vector<Dense> dense = load_dense(c, s);
    for (Layer& layer : model) {
      for (Expert& x : layer.experts) hold_in_format(c, s, x);
      hold_in_format(c, s, layer.shared);
    }
    for (Dense& d : dense) hold_in_format(c, s, d.ffn);
    g_products = local_products(c);
    // The reference rounds the same activations, but from values a few fp32
    // ulps from moed's, so now and then one lands on the other side of a
    // rounding and moves its terms by one step (2^-8 of the value in bf16,
    // amax / 127 of its row in int8). The default tolerance then is 2^-8,
    // not fp32's: measured, the largest difference stays near 2.5e-4, and
    // outputs of the other products exceed it.
    if (g_products != moed::kernels::CompactProducts::f32 && !app.count("--atol")) atol = 0x1p-8;
    if (g_products != moed::kernels::CompactProducts::f32 && !app.count("--rtol")) rtol = 0x1p-8;
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
      // The model's layers in order: the MoE layers, and the dense ones served.
      std::size_t next_dense = 0;
      for (int m = 0; m < s.spec.model_layers; ++m) {
        const int l = s.spec.moe_index(m);
        if (l < 0) {
          if (next_dense < dense.size() && dense[next_dense].model_layer == m) dense_forward(dense[next_dense++], c, x);
          continue;
        }
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
