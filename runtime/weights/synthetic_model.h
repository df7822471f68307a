// A synthetic MoE model of any shape, a pure function of (seed, tensor name):
// `moed --generate-weights` writes it as safetensors, and with no weights file
// each rank makes just the tensors of its own slots in memory, with the same
// values (rounded to bf16 when the dtype says so).
//
// Its gate is structured so that routing behaves like a trained model's:
// expert e of layer l looks along a "concept" direction u[σ_l(e)] (σ_0 is the
// identity, later layers permute), so a token whose hidden state points at a
// few concepts is routed to the same group of experts in every layer
// (co-activation), and to a predictable expert in the next layer (affinity).
// The expert FFNs are random with a small output scale, so the residual
// stream, and with it the routing, stays on topic from layer to layer.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "kernels/cpu/weight_codes.h"
#include "runtime/weights/model.h"
#include "runtime/weights/safetensors_format.h"
#include "runtime/weights/safetensors_writer.h"

namespace moed::runtime {

class SyntheticModel {
 public:
  SyntheticModel(ModelShape shape, std::uint64_t seed, weights::DType dtype);

  const ModelShape& shape() const { return shape_; }
  // Every tensor by its role, in moed's layout whatever the family's files
  // hold (gate and up split, not interleaved or fused); `layer` is the model
  // layer number, and each values stream is keyed by the family's tensor name.
  void gate(int layer, float* out) const;                       // [experts, hidden]
  void norm(int layer, float* out) const;                       // [hidden]
  void up(int layer, int expert, int which, float* out) const;  // which 1 (gate) or 3 (up): [ffn, hidden]
  void down(int layer, int expert, float* out) const;           // w2: [hidden, ffn]
  void gate_bias(int layer, float* out) const;                  // [experts] (gpt-oss)
  void selection_bias(int layer, float* out) const;             // [experts] (deepseek_v3)
  // Expert biases (gpt-oss): which 1 (gate) or 3 (up): [ffn]; 2 (down): [hidden].
  void expert_bias(int layer, int expert, int which, float* out) const;
  void shared(int layer, ExpertPart part, float* out) const;    // gate, up [Fs, hidden]; down [hidden, Fs]
  void shared_gate(int layer, float* out) const;                // [hidden] (qwen2_moe)
  // A dense layer's FFN: gate, up [dense F, hidden]; down [hidden, dense F].
  void dense(int layer, ExpertPart part, float* out) const;

  // Writes the checkpoint in the family's names and layout: a directory
  // with config.json (its RMSNorm epsilon `norm_eps`) and model.safetensors,
  // or, for a path ending in .safetensors, that file alone (whose family a
  // loader must then be told: [model].family). Each file atomically. The
  // experts (shared and dense FFNs too) in `experts`: fp8 as DeepSeek ships
  // it, mxfp4 as gpt-oss does (each family's layout only), else in the
  // float dtype.
  void write(const std::string& path, double norm_eps,
             kernels::WeightDtype experts = kernels::WeightDtype::f32) const;

 private:
  std::string stream_name(int layer, int expert, ExpertPart part) const;
  bool clamped() const { return shape_.spec.expert.activation == Activation::clamped_swiglu; }
  // out[0, n) = scale x uniform(-1, 1), the stream of `name`, rounded to the dtype.
  void fill(const std::string& name, float scale, std::size_t n, float* out) const;
  void whole_ffn(const std::string& name, std::size_t F, ExpertPart part, float* out) const;
  void add_tensors(weights::SafetensorsWriter& writer, kernels::WeightDtype experts) const;
  void add_fused_experts(weights::SafetensorsWriter& writer, int layer, kernels::WeightDtype experts) const;

  ModelShape shape_;
  TensorNames names_;
  std::uint64_t seed_;
  weights::DType dtype_;
  std::vector<float> concepts_;  // [experts, hidden], shared by every layer's gate
};

}  // namespace moed::runtime
