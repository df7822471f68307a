#include "runtime/weights/synthetic_model.h"

#include <cmath>
#include <filesystem>
#include <functional>
#include <numeric>
#include <vector>

#include <fmt/format.h>

#include "common/atomic_file.h"
#include "common/error.h"
#include "common/rng.h"
#include "kernels/cpu/encoded_matrix.h"
#include "runtime/weights/safetensors_writer.h"

namespace moed::runtime {

namespace {

// Gate logits come out at about kGateScale for a token aligned with one concept,
// which gives Mixtral-like gate weights (top-1 about 0.6 of 8 experts).
constexpr float kGateScale = 4.0f;
constexpr float kGateNoise = 0.3f;     // how far a gate row strays from its concept
constexpr float kDownScale = 0.25f;    // expert output scale relative to the residual
constexpr float kGateBiasScale = 0.4f;       // gpt-oss's router bias, against logits of about kGateScale
constexpr float kSelectionBiasScale = 0.05f; // DeepSeek's correction bias, against sigmoid scores in (0, 1)
constexpr float kExpertBiasScale = 0.1f;     // gpt-oss's expert biases, against unit-variance projections
// gpt-oss's up-projections spread 3x wider, so that its clamps at +-7 bite on
// about 1% of the gates and 2% of the ups; its down-projections 10x narrower,
// to keep the experts' outputs beside the residual's scale.
constexpr float kClampedUpSpread = 3.0f, kClampedDownSpread = 0.1f;

CounterRng stream(std::uint64_t seed, const std::string& name) {
  return CounterRng(hash_combine(seed, hash_name(name)));
}

void round_to_dtype(weights::DType dtype, float* data, std::size_t n) {
  if (dtype != weights::DType::BF16) return;
  for (std::size_t i = 0; i < n; ++i) data[i] = weights::bf16_to_f32(weights::f32_to_bf16(data[i]));
}

// The concept directions, one unit row of `hidden` per expert: random, and
// orthonormal (Gram-Schmidt, in order) when there are no more experts than
// dimensions, so that concepts do not leak into each other's logits.
std::vector<float> concepts(std::uint64_t seed, int experts, int hidden) {
  std::vector<double> u(std::size_t(experts) * hidden);
  for (int j = 0; j < experts; ++j) {
    CounterRng rng = stream(seed, fmt::format("concept.{}", j));
    double* row = u.data() + std::size_t(j) * hidden;
    for (int i = 0; i < hidden; ++i) row[i] = rng.normalish(i);
    if (experts <= hidden) {
      for (int q = 0; q < j; ++q) {
        const double* prev = u.data() + std::size_t(q) * hidden;
        double dot = 0;
        for (int i = 0; i < hidden; ++i) dot += row[i] * prev[i];
        for (int i = 0; i < hidden; ++i) row[i] -= dot * prev[i];
      }
    }
    double norm = 0;
    for (int i = 0; i < hidden; ++i) norm += row[i] * row[i];
    for (int i = 0; i < hidden; ++i) row[i] /= std::sqrt(norm);
  }
  return std::vector<float>(u.begin(), u.end());
}

// σ_l: the concept that expert e of layer l follows. Identity at layer 0.
std::vector<int> concept_of_expert(std::uint64_t seed, int experts, int layer) {
  std::vector<int> perm(experts);
  std::iota(perm.begin(), perm.end(), 0);
  if (layer == 0) return perm;
  Rng rng(hash_combine(seed, hash_name(fmt::format("layer-permutation.{}", layer))));
  for (int i = experts - 1; i > 0; --i) std::swap(perm[i], perm[rng.below(i + 1)]);
  return perm;
}

}  // namespace

SyntheticModel::SyntheticModel(ModelShape shape, std::uint64_t seed, weights::DType dtype)
    : shape_(shape),
      names_(shape.spec.family),
      seed_(seed),
      dtype_(dtype),
      concepts_(concepts(seed, shape.experts, shape.hidden)) {}

// Each tensor's values are a stream keyed by its name in the family's files
// (Mixtral's are those of every earlier version). gpt-oss's experts live in
// fused per-layer tensors, so an expert's part is keyed by the fused name,
// the expert and the part.
std::string SyntheticModel::stream_name(int layer, int expert, ExpertPart part) const {
  if (shape_.spec.family != Family::gpt_oss) return names_.expert(layer, expert, part);
  const char* fused = part == ExpertPart::down ? "down_proj" : "gate_up_proj";
  return fmt::format("{}[{}].{}", names_.fused(layer, fused), expert, part == ExpertPart::up ? "up" : "gate");
}

void SyntheticModel::fill(const std::string& name, float scale, std::size_t n, float* out) const {
  CounterRng rng = stream(seed_, name);
  for (std::size_t i = 0; i < n; ++i) out[i] = scale * rng.symmetric(i);
  round_to_dtype(dtype_, out, n);
}

void SyntheticModel::gate(int layer, float* out) const {
  const int E = shape_.experts, H = shape_.hidden;
  const float scale = kGateScale / std::sqrt(float(H));
  const std::vector<float>& u = concepts_;
  const std::vector<int> sigma = concept_of_expert(seed_, E, layer);
  CounterRng noise = stream(seed_, names_.gate(layer));
  for (int e = 0; e < E; ++e)
    for (int i = 0; i < H; ++i)
      out[std::size_t(e) * H + i] =
          scale * (u[std::size_t(sigma[e]) * H + i] +
                   kGateNoise * noise.normalish(std::uint64_t(e) * H + i) / std::sqrt(float(H)));
  round_to_dtype(dtype_, out, std::size_t(E) * H);
}

void SyntheticModel::norm(int layer, float* out) const {
  CounterRng rng = stream(seed_, names_.norm(layer));
  for (int i = 0; i < shape_.hidden; ++i) out[i] = 1.0f + 0.1f * rng.symmetric(i);
  round_to_dtype(dtype_, out, shape_.hidden);
}

void SyntheticModel::up(int layer, int expert, int which, float* out) const {
  const ExpertPart part = which == 1 ? ExpertPart::gate : ExpertPart::up;
  const float spread = clamped() ? kClampedUpSpread : 1.0f;
  fill(stream_name(layer, expert, part), spread * std::sqrt(3.0f / float(shape_.hidden)),  // unit variance of W x
       std::size_t(shape_.ffn) * shape_.hidden, out);
}

void SyntheticModel::down(int layer, int expert, float* out) const {
  const float spread = clamped() ? kClampedDownSpread : 1.0f;
  fill(stream_name(layer, expert, ExpertPart::down), spread * kDownScale * std::sqrt(3.0f / float(shape_.ffn)),
       std::size_t(shape_.hidden) * shape_.ffn, out);
}

void SyntheticModel::gate_bias(int layer, float* out) const {
  // About a tenth of the logits' spread: it moves near-ties, not the concepts.
  fill(names_.gate_bias(layer), kGateBiasScale, std::size_t(shape_.experts), out);
}

void SyntheticModel::selection_bias(int layer, float* out) const {
  fill(names_.selection_bias(layer), kSelectionBiasScale, std::size_t(shape_.experts), out);
}

void SyntheticModel::expert_bias(int layer, int expert, int which, float* out) const {
  const char* part = which == 1 ? "gate" : which == 3 ? "up" : "down";
  const std::string name = fmt::format("{}[{}].{}", names_.fused(layer, which == 2 ? "down_proj_bias" : "gate_up_proj_bias"),
                                       expert, part);
  if (which == 2)
    fill(name, kClampedDownSpread * kDownScale * kExpertBiasScale, std::size_t(shape_.hidden), out);
  else
    fill(name, kExpertBiasScale, std::size_t(shape_.ffn), out);
}

// A SwiGLU FFN held whole (a shared expert, a dense layer): the routed
// experts' scales at its own F.
void SyntheticModel::whole_ffn(const std::string& name, std::size_t F, ExpertPart part, float* out) const {
  const std::size_t H = std::size_t(shape_.hidden);
  if (part == ExpertPart::down)
    fill(name, kDownScale * std::sqrt(3.0f / float(F)), H * F, out);
  else
    fill(name, std::sqrt(3.0f / float(H)), F * H, out);
}

void SyntheticModel::shared(int layer, ExpertPart part, float* out) const {
  whole_ffn(names_.shared(layer, part), std::size_t(shape_.spec.shared_ffn), part, out);
}

void SyntheticModel::shared_gate(int layer, float* out) const {
  // g x about unit variance: the shared expert's weight sigmoid(g x) spreads over (0.2, 0.8).
  fill(names_.shared_gate(layer), std::sqrt(3.0f / float(shape_.hidden)), std::size_t(shape_.hidden), out);
}

void SyntheticModel::dense(int layer, ExpertPart part, float* out) const {
  whole_ffn(names_.dense(layer, part), std::size_t(shape_.spec.dense_ffn), part, out);
}

namespace {

std::size_t numel(const std::vector<std::int64_t>& dims) {
  return std::size_t(std::accumulate(dims.begin(), dims.end(), std::int64_t{1}, std::multiplies<>()));
}

}  // namespace

void SyntheticModel::add_tensors(weights::SafetensorsWriter& writer, kernels::WeightDtype experts) const {
  const ModelSpec& spec = shape_.spec;
  const std::int64_t E = shape_.experts, H = shape_.hidden, F = shape_.ffn, Fs = spec.shared_ffn;
  std::vector<float> buf;
  auto add = [&](const std::string& name, const std::vector<std::int64_t>& dims, auto&& make) {
    buf.resize(numel(dims));
    make(buf.data());
    writer.add(name, dtype_, dims, buf.data());
  };
  // An FFN's matrix: in fp8, its e4m3 codes and the fp32 scale of each
  // 128 x 128 tile beside it (`<name>_scale_inv`), as DeepSeek ships them;
  // otherwise in the checkpoint's float dtype (int8 quantizes at load).
  auto add_matrix = [&](const std::string& name, const std::vector<std::int64_t>& dims, auto&& make) {
    if (experts != kernels::WeightDtype::fp8) return add(name, dims, make);
    buf.resize(numel(dims));
    make(buf.data());
    const kernels::EncodedMatrix m = kernels::encode(experts, buf.data(), std::size_t(dims[0]), std::size_t(dims[1]));
    const std::int64_t tile = kernels::kFp8Tile;
    writer.add_raw(name, "F8_E4M3", dims, m.codes.data(), m.codes.size());
    writer.add_raw(name + "_scale_inv", "F32", {(dims[0] + tile - 1) / tile, (dims[1] + tile - 1) / tile},
                   m.scales.data(), m.scales.size());
  };
  for (int i = 0; i < shape_.layers; ++i) {
    const int l = spec.model_layer(i);
    add(names_.norm(l), {H}, [&](float* p) { norm(l, p); });
    add(names_.gate(l), {E, H}, [&](float* p) { gate(l, p); });
    if (spec.router.gate_bias) add(names_.gate_bias(l), {E}, [&](float* p) { gate_bias(l, p); });
    if (spec.router.selection_bias) add(names_.selection_bias(l), {E}, [&](float* p) { selection_bias(l, p); });
    if (spec.family == Family::gpt_oss) {
      add_fused_experts(writer, l, experts);
    } else {
      for (int e = 0; e < E; ++e) {
        add_matrix(names_.expert(l, e, ExpertPart::gate), {F, H}, [&](float* p) { up(l, e, 1, p); });
        add_matrix(names_.expert(l, e, ExpertPart::down), {H, F}, [&](float* p) { down(l, e, p); });
        add_matrix(names_.expert(l, e, ExpertPart::up), {F, H}, [&](float* p) { up(l, e, 3, p); });
      }
    }
    if (Fs > 0) {
      add_matrix(names_.shared(l, ExpertPart::gate), {Fs, H}, [&](float* p) { shared(l, ExpertPart::gate, p); });
      add_matrix(names_.shared(l, ExpertPart::up), {Fs, H}, [&](float* p) { shared(l, ExpertPart::up, p); });
      add_matrix(names_.shared(l, ExpertPart::down), {H, Fs}, [&](float* p) { shared(l, ExpertPart::down, p); });
    }
    if (spec.shared_gated) add(names_.shared_gate(l), {1, H}, [&](float* p) { shared_gate(l, p); });
  }
  // The dense layers' FFNs and norms, as a real checkpoint holds them (moed
  // serves them only with [model].serve_dense).
  const std::int64_t Fd = spec.dense_ffn;
  for (int l : spec.dense_layers()) {
    add(names_.norm(l), {H}, [&](float* p) { norm(l, p); });
    add_matrix(names_.dense(l, ExpertPart::gate), {Fd, H}, [&](float* p) { dense(l, ExpertPart::gate, p); });
    add_matrix(names_.dense(l, ExpertPart::up), {Fd, H}, [&](float* p) { dense(l, ExpertPart::up, p); });
    add_matrix(names_.dense(l, ExpertPart::down), {H, Fd}, [&](float* p) { dense(l, ExpertPart::down, p); });
  }
}

// gpt-oss's layout, as transformers' GptOssExperts holds it: gate_up_proj
// [E, H, 2F] with the gate in the even columns and the up-projection in the
// odd ones (W1|W3 transposed and interleaved), down_proj [E, F, H] (W2
// transposed), and their biases [E, 2F] (interleaved alike) and [E, H]. In
// mxfp4, as gpt-oss ships it: gate_up_proj_blocks [E, 2F, H/32, 16] (rows
// interleaved alike, not transposed) with _scales [E, 2F, H/32], and
// down_proj_blocks [E, H, F/32, 16] with _scales [E, H, F/32].
void SyntheticModel::add_fused_experts(weights::SafetensorsWriter& writer, int l, kernels::WeightDtype experts) const {
  const std::size_t E = std::size_t(shape_.experts), H = std::size_t(shape_.hidden), F = std::size_t(shape_.ffn);
  std::vector<float> gate_up(E * H * 2 * F), gate_up_bias(E * 2 * F), down_t(E * F * H), down_bias(E * H);
  std::vector<float> w1(F * H), w3(F * H), w2(H * F), b1(F), b3(F);
  for (std::size_t e = 0; e < E; ++e) {
    up(l, int(e), 1, w1.data());
    up(l, int(e), 3, w3.data());
    down(l, int(e), w2.data());
    expert_bias(l, int(e), 1, b1.data());
    expert_bias(l, int(e), 3, b3.data());
    expert_bias(l, int(e), 2, down_bias.data() + e * H);
    for (std::size_t i = 0; i < H; ++i)
      for (std::size_t j = 0; j < F; ++j) {
        gate_up[(e * H + i) * 2 * F + 2 * j] = w1[j * H + i];
        gate_up[(e * H + i) * 2 * F + 2 * j + 1] = w3[j * H + i];
        down_t[(e * F + j) * H + i] = w2[i * F + j];
      }
    for (std::size_t j = 0; j < F; ++j) {
      gate_up_bias[e * 2 * F + 2 * j] = b1[j];
      gate_up_bias[e * 2 * F + 2 * j + 1] = b3[j];
    }
  }
  const auto e = std::int64_t(E), h = std::int64_t(H), f = std::int64_t(F);
  writer.add(names_.fused(l, "gate_up_proj_bias"), dtype_, {e, 2 * f}, gate_up_bias.data());
  writer.add(names_.fused(l, "down_proj_bias"), dtype_, {e, h}, down_bias.data());
  if (experts != kernels::WeightDtype::mxfp4) {
    writer.add(names_.fused(l, "gate_up_proj"), dtype_, {e, h, 2 * f}, gate_up.data());
    writer.add(names_.fused(l, "down_proj"), dtype_, {e, f, h}, down_t.data());
    return;
  }
  // Each expert's W1 and W3 encoded apart (as the loader's in-memory model
  // does), their rows then interleaved.
  std::vector<std::uint8_t> gu_codes, gu_scales, d_codes, d_scales;
  for (std::size_t x = 0; x < E; ++x) {
    up(l, int(x), 1, w1.data());
    up(l, int(x), 3, w3.data());
    down(l, int(x), w2.data());
    const kernels::EncodedMatrix m1 = kernels::encode(experts, w1.data(), F, H),
                                 m3 = kernels::encode(experts, w3.data(), F, H),
                                 m2 = kernels::encode(experts, w2.data(), H, F);
    const std::size_t code_row = H / 2, scale_row = H / kernels::kMxBlock;
    for (std::size_t j = 0; j < F; ++j)
      for (const kernels::EncodedMatrix* m : {&m1, &m3}) {
        gu_codes.insert(gu_codes.end(), m->codes.begin() + std::ptrdiff_t(j * code_row),
                        m->codes.begin() + std::ptrdiff_t((j + 1) * code_row));
        gu_scales.insert(gu_scales.end(), m->scales.begin() + std::ptrdiff_t(j * scale_row),
                         m->scales.begin() + std::ptrdiff_t((j + 1) * scale_row));
      }
    d_codes.insert(d_codes.end(), m2.codes.begin(), m2.codes.end());
    d_scales.insert(d_scales.end(), m2.scales.begin(), m2.scales.end());
  }
  const std::int64_t bh = h / kernels::kMxBlock, bf = f / kernels::kMxBlock;
  writer.add_raw(names_.fused(l, "gate_up_proj_blocks"), "U8", {e, 2 * f, bh, 16}, gu_codes.data(), gu_codes.size());
  writer.add_raw(names_.fused(l, "gate_up_proj_scales"), "U8", {e, 2 * f, bh}, gu_scales.data(), gu_scales.size());
  writer.add_raw(names_.fused(l, "down_proj_blocks"), "U8", {e, h, bf, 16}, d_codes.data(), d_codes.size());
  writer.add_raw(names_.fused(l, "down_proj_scales"), "U8", {e, h, bf}, d_scales.data(), d_scales.size());
}

void SyntheticModel::write(const std::string& path, double norm_eps, kernels::WeightDtype experts) const {
  namespace fs = std::filesystem;
  const bool fused = shape_.spec.family == Family::gpt_oss;
  if ((experts == kernels::WeightDtype::mxfp4 && !fused) || (experts == kernels::WeightDtype::fp8 && fused))
    MOED_THROW(Usage, "--generate-weights: {} checkpoints are written in {}'s layout only; this model is {} (its "
                      "experts can still be held in {} from synthetic weights in memory)",
               kernels::to_string(experts), fused ? "DeepSeek's per-expert" : "gpt-oss's fused",
               name_of(shape_.spec.family), kernels::to_string(experts));
  weights::SafetensorsWriter writer;
  writer.set_metadata("format", "pt");
  writer.set_metadata("moed.synthetic", fmt::format("seed={} {} {}", seed_, name_of(shape_.spec.family), shape_.describe()));
  add_tensors(writer, experts);
  if (path.size() > 12 && path.ends_with(".safetensors")) {  // the tensors alone; [model].family says whose
    writer.write(path);
    return;
  }
  std::error_code ec;
  fs::create_directories(path, ec);
  if (ec || !fs::is_directory(path))
    MOED_THROW(Input, "--generate-weights {}: cannot create the checkpoint directory: {}", path,
               ec ? ec.message() : "a file of that name is in the way");
  writer.write((fs::path(path) / "model.safetensors").string());
  const ModelDims dims{shape_.layers, shape_.experts, shape_.top_k, shape_.hidden, shape_.ffn, norm_eps};
  const bool shipped = experts == kernels::WeightDtype::fp8 || experts == kernels::WeightDtype::mxfp4;
  write_file_atomically((fs::path(path) / "config.json").string(),
                        hf_config_json(shape_.spec, dims, dtype_ == weights::DType::BF16 ? "bfloat16" : "float32",
                                       shipped ? kernels::to_string(experts) : ""));
}

}  // namespace moed::runtime
