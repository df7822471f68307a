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

#include "runtime/weights/model.h"
#include "runtime/weights/safetensors_format.h"

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

  // Writes the checkpoint: a directory with config.json and model.safetensors
  // in the family's names and layout, or (Mixtral, a path ending in
  // .safetensors) the single file as before. Atomic.
  void write(const std::string& path) const;

 private:
  ModelShape shape_;
  std::uint64_t seed_;
  weights::DType dtype_;
  std::vector<float> concepts_;  // [experts, hidden], shared by every layer's gate
};

}  // namespace moed::runtime
