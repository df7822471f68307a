// The shape of the MoE layers served and the tensor names they load, each
// family's Hugging Face names, so a published checkpoint's MoE tensors load.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "runtime/config/config.h"

namespace moed::runtime {

struct ModelShape {
  int layers = 0, experts = 0, top_k = 0, hidden = 0, ffn = 0;  // layers: MoE layers served
  ModelSpec spec;  // the family's router, experts, shared expert and layer numbers

  static ModelShape from(const ModelConfig& m);
  // Parameters of one expert (W1, W3: F x H; W2: H x F).
  std::int64_t expert_params() const { return 3ll * hidden * ffn; }
  std::string describe() const;  // "4 layers x 8 experts, top-2, H=512 F=1024"
};

enum class ExpertPart { gate, up, down };  // Mixtral's w1, w3, w2

// A family's tensor names; `layer` is the model's own layer number.
class TensorNames {
 public:
  explicit TensorNames(Family family) : family_(family) {}

  std::string norm(int layer) const;            // post_attention_layernorm [H]
  std::string gate(int layer) const;            // the router [E, H]
  std::string gate_bias(int layer) const;       // gpt-oss: router.bias [E]
  std::string selection_bias(int layer) const;  // DeepSeek-V3: e_score_correction_bias [E]
  // A routed expert's matrix (every family but gpt-oss): gate, up [F, H]; down [H, F].
  std::string expert(int layer, int expert, ExpertPart part) const;
  // gpt-oss's fused experts of a layer: "gate_up_proj" [E, H, 2F] (gate and
  // up interleaved along 2F), "gate_up_proj_bias" [E, 2F], "down_proj"
  // [E, F, H], "down_proj_bias" [E, H].
  std::string fused(int layer, const char* which) const;
  std::string shared(int layer, ExpertPart part) const;  // gate, up [Fs, H]; down [H, Fs]
  std::string shared_gate(int layer) const;              // Qwen2-MoE: shared_expert_gate [1, H]
  std::string dense(int layer, ExpertPart part) const;   // a dense layer's FFN

 private:
  Family family_;
};

// model.layers.{l}.block_sparse_moe.gate.weight: [experts, hidden]
std::string gate_tensor(int layer);
// model.layers.{l}.block_sparse_moe.experts.{e}.{w1,w2,w3}.weight
std::string expert_tensor(int layer, int expert, const char* which);
// model.layers.{l}.post_attention_layernorm.weight: [hidden], the RMSNorm before the MoE block
std::string norm_tensor(int layer);

std::vector<std::int64_t> gate_shape(const ModelShape& s);
std::vector<std::int64_t> up_shape(const ModelShape& s);    // w1, w3: [ffn, hidden]
std::vector<std::int64_t> down_shape(const ModelShape& s);  // w2: [hidden, ffn]
std::vector<std::int64_t> norm_shape(const ModelShape& s);

}  // namespace moed::runtime
