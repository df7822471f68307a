#include "runtime/weights/synthetic_model.h"

#include <cmath>
#include <numeric>
#include <vector>

#include <fmt/format.h>

#include "common/rng.h"
#include "runtime/weights/safetensors_writer.h"

namespace moed::runtime {

namespace {

// Gate logits come out at about kGateScale for a token aligned with one concept,
// which gives Mixtral-like gate weights (top-1 about 0.6 of 8 experts).
constexpr float kGateScale = 4.0f;
constexpr float kGateNoise = 0.3f;     // how far a gate row strays from its concept
constexpr float kDownScale = 0.25f;    // expert output scale relative to the residual

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
    : shape_(shape), seed_(seed), dtype_(dtype), concepts_(concepts(seed, shape.experts, shape.hidden)) {}

void SyntheticModel::gate(int layer, float* out) const {
  const int E = shape_.experts, H = shape_.hidden;
  const float scale = kGateScale / std::sqrt(float(H));
  const std::vector<float>& u = concepts_;
  const std::vector<int> sigma = concept_of_expert(seed_, E, layer);
  CounterRng noise = stream(seed_, gate_tensor(layer));
  for (int e = 0; e < E; ++e)
    for (int i = 0; i < H; ++i)
      out[std::size_t(e) * H + i] =
          scale * (u[std::size_t(sigma[e]) * H + i] +
                   kGateNoise * noise.normalish(std::uint64_t(e) * H + i) / std::sqrt(float(H)));
  round_to_dtype(dtype_, out, std::size_t(E) * H);
}

void SyntheticModel::norm(int layer, float* out) const {
  CounterRng rng = stream(seed_, norm_tensor(layer));
  for (int i = 0; i < shape_.hidden; ++i) out[i] = 1.0f + 0.1f * rng.symmetric(i);
  round_to_dtype(dtype_, out, shape_.hidden);
}

void SyntheticModel::up(int layer, int expert, int which, float* out) const {
  CounterRng rng = stream(seed_, expert_tensor(layer, expert, which == 1 ? "w1" : "w3"));
  const std::size_t n = std::size_t(shape_.ffn) * shape_.hidden;
  const float scale = std::sqrt(3.0f / float(shape_.hidden));  // unit variance of W x
  for (std::size_t i = 0; i < n; ++i) out[i] = scale * rng.symmetric(i);
  round_to_dtype(dtype_, out, n);
}

void SyntheticModel::down(int layer, int expert, float* out) const {
  CounterRng rng = stream(seed_, expert_tensor(layer, expert, "w2"));
  const std::size_t n = std::size_t(shape_.hidden) * shape_.ffn;
  const float scale = kDownScale * std::sqrt(3.0f / float(shape_.ffn));
  for (std::size_t i = 0; i < n; ++i) out[i] = scale * rng.symmetric(i);
  round_to_dtype(dtype_, out, n);
}

void SyntheticModel::write(const std::string& path) const {
  weights::SafetensorsWriter writer;
  writer.set_metadata("format", "pt");
  writer.set_metadata("moed.synthetic",
                      fmt::format("seed={} {}", seed_, shape_.describe()));
  std::vector<float> buf;
  auto add = [&](const std::string& name, const std::vector<std::int64_t>& dims, auto&& fill) {
    buf.resize(std::size_t(std::accumulate(dims.begin(), dims.end(), std::int64_t{1}, std::multiplies<>())));
    fill(buf.data());
    writer.add(name, dtype_, dims, buf.data());
  };
  for (int l = 0; l < shape_.layers; ++l) {
    add(norm_tensor(l), norm_shape(shape_), [&](float* p) { norm(l, p); });
    add(gate_tensor(l), gate_shape(shape_), [&](float* p) { gate(l, p); });
    for (int e = 0; e < shape_.experts; ++e) {
      add(expert_tensor(l, e, "w1"), up_shape(shape_), [&](float* p) { up(l, e, 1, p); });
      add(expert_tensor(l, e, "w2"), down_shape(shape_), [&](float* p) { down(l, e, p); });
      add(expert_tensor(l, e, "w3"), up_shape(shape_), [&](float* p) { up(l, e, 3, p); });
    }
  }
  writer.write(path);
}

}  // namespace moed::runtime
