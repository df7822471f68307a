#include "runtime/weights/model.h"

#include <fmt/format.h>

namespace moed::runtime {

ModelShape ModelShape::from(const ModelConfig& m) {
  return {int(m.layers), int(m.experts), int(m.top_k), int(m.hidden), int(m.ffn)};
}

std::string ModelShape::describe() const {
  return fmt::format("{} layers x {} experts, top-{}, H={} F={}", layers, experts, top_k, hidden, ffn);
}

std::string gate_tensor(int layer) {
  return fmt::format("model.layers.{}.block_sparse_moe.gate.weight", layer);
}

std::string expert_tensor(int layer, int expert, const char* which) {
  return fmt::format("model.layers.{}.block_sparse_moe.experts.{}.{}.weight", layer, expert, which);
}

std::string norm_tensor(int layer) {
  return fmt::format("model.layers.{}.post_attention_layernorm.weight", layer);
}

std::vector<std::int64_t> gate_shape(const ModelShape& s) { return {s.experts, s.hidden}; }
std::vector<std::int64_t> up_shape(const ModelShape& s) { return {s.ffn, s.hidden}; }
std::vector<std::int64_t> down_shape(const ModelShape& s) { return {s.hidden, s.ffn}; }
std::vector<std::int64_t> norm_shape(const ModelShape& s) { return {s.hidden}; }

}  // namespace moed::runtime
