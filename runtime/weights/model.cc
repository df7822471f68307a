#include "runtime/weights/model.h"

#include <fmt/format.h>

namespace moed::runtime {

ModelShape ModelShape::from(const ModelConfig& m) {
  return {int(m.layers), int(m.experts), int(m.top_k), int(m.hidden), int(m.ffn), model_spec(m)};
}

std::string ModelShape::describe() const {
  return fmt::format("{} layers x {} experts, top-{}, H={} F={}", layers, experts, top_k, hidden, ffn);
}

namespace {
const char* part_name(ExpertPart p) { return p == ExpertPart::gate ? "gate" : p == ExpertPart::up ? "up" : "down"; }
const char* mixtral_name(ExpertPart p) { return p == ExpertPart::gate ? "w1" : p == ExpertPart::up ? "w3" : "w2"; }
}  // namespace

std::string TensorNames::norm(int layer) const { return norm_tensor(layer); }

std::string TensorNames::gate(int layer) const {
  switch (family_) {
    case Family::mixtral: return gate_tensor(layer);
    case Family::gpt_oss: return fmt::format("model.layers.{}.mlp.router.weight", layer);
    default: return fmt::format("model.layers.{}.mlp.gate.weight", layer);
  }
}

std::string TensorNames::gate_bias(int layer) const { return fmt::format("model.layers.{}.mlp.router.bias", layer); }

std::string TensorNames::selection_bias(int layer) const {
  return fmt::format("model.layers.{}.mlp.gate.e_score_correction_bias", layer);
}

std::string TensorNames::expert(int layer, int expert, ExpertPart part) const {
  if (family_ == Family::mixtral) return expert_tensor(layer, expert, mixtral_name(part));
  return fmt::format("model.layers.{}.mlp.experts.{}.{}_proj.weight", layer, expert, part_name(part));
}

std::string TensorNames::fused(int layer, const char* which) const {
  return fmt::format("model.layers.{}.mlp.experts.{}", layer, which);
}

std::string TensorNames::shared(int layer, ExpertPart part) const {
  return fmt::format("model.layers.{}.mlp.{}.{}_proj.weight", layer,
                     family_ == Family::qwen2_moe ? "shared_expert" : "shared_experts", part_name(part));
}

std::string TensorNames::shared_gate(int layer) const {
  return fmt::format("model.layers.{}.mlp.shared_expert_gate.weight", layer);
}

std::string TensorNames::dense(int layer, ExpertPart part) const {
  return fmt::format("model.layers.{}.mlp.{}_proj.weight", layer, part_name(part));
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
