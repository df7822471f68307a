// The shape of the MoE layers served and the tensor names they load, which
// follow Mixtral's Hugging Face layout so a real checkpoint's MoE tensors load.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "runtime/config/config.h"

namespace moed::runtime {

struct ModelShape {
  int layers = 0, experts = 0, top_k = 0, hidden = 0, ffn = 0;

  static ModelShape from(const ModelConfig& m);
  // Parameters of one expert (W1, W3: F x H; W2: H x F).
  std::int64_t expert_params() const { return 3ll * hidden * ffn; }
  std::string describe() const;  // "4 layers x 8 experts, top-2, H=512 F=1024"
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
