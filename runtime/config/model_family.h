// The model families moed serves, and what each one's MoE layer computes, as
// a ModelSpec: how its router scores and picks experts, what its experts
// compute, its shared expert and which of the model's layers are MoE layers.
// A spec comes from a Hugging Face checkpoint's config.json (read_hf_config)
// or, for synthetic weights, from [model]'s keys (synthetic_spec); the
// checkpoint writer writes it back as config.json (hf_config_json), so the
// two meet. Pure: no tensors, no files but config.json.
//
// The formulas are each family's reference code's (docs/model-families.md).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "common/name_table.h"

namespace moed::runtime {

// As config.json's "model_type" spells them (DeepSeek-R1 is deepseek_v3).
enum class Family { mixtral, deepseek_v3, qwen3_moe, qwen2_moe, olmoe, gpt_oss };
inline constexpr auto kFamilyNames = config::name_table<Family>({{Family::mixtral, "mixtral"},
                                                                 {Family::deepseek_v3, "deepseek_v3"},
                                                                 {Family::qwen3_moe, "qwen3_moe"},
                                                                 {Family::qwen2_moe, "qwen2_moe"},
                                                                 {Family::olmoe, "olmoe"},
                                                                 {Family::gpt_oss, "gpt_oss"}});
inline std::string_view name_of(Family v) { return kFamilyNames.name(v); }

enum class Scoring { softmax, sigmoid };

// One router, every family a setting of it. With l = W_g x (+ b_g):
//   score s = softmax(l) or sigmoid(l) (or l itself when softmax_after_topk);
//   selection uses s + b (b: the selection bias, DeepSeek's e_score_correction_bias),
//   restricted to the `groups_kept` best of `groups` equal groups of experts
//   (a group's score: the sum of its top-2 when there is a selection bias,
//   else its maximum);
//   weights = the unbiased s of the k chosen, renormalised to sum 1 when
//   `renormalize`, times `scaling`; with softmax_after_topk, the softmax
//   of the chosen logits instead (gpt-oss).
struct RouterSpec {
  Scoring scoring = Scoring::softmax;
  bool gate_bias = false;           // l = W_g x + b_g (gpt-oss's router.bias)
  bool selection_bias = false;      // DeepSeek-V3's e_score_correction_bias
  int groups = 1, groups_kept = 1;  // DeepSeek's n_group, topk_group
  bool renormalize = true;          // norm_topk_prob
  double scaling = 1.0;             // routed_scaling_factor
  bool softmax_after_topk = false;  // gpt-oss: top-k of the logits, then softmax over those k
};

enum class Activation {
  swiglu,          // w2(silu(w1 x) * w3 x)
  clamped_swiglu,  // gpt-oss: gate = min(g, limit), up = clamp(u, -limit, limit), gate * sigmoid(alpha gate) * (up + 1)
};

struct ExpertSpec {
  Activation activation = Activation::swiglu;
  bool biases = false;       // b1|b3 after the up-projection, b2 after the down
  double alpha = 1.702, limit = 7.0;
  bool interleaved = false;  // the checkpoint's fused gate_up rows alternate gate, up (gpt-oss)
};

struct ModelSpec {
  Family family = Family::mixtral;
  int model_layers = 0;         // all the model's decoder layers
  std::vector<int> moe_layers;  // the model layer number of each MoE layer, ascending
  std::int64_t dense_ffn = 0;   // intermediate size of the dense layers' FFN (0: none)
  RouterSpec router;
  ExpertSpec expert;
  std::int64_t shared_ffn = 0;  // F of the shared expert (0: none)
  bool shared_gated = false;    // Qwen2-MoE: sigmoid(shared_expert_gate x) scales it

  // The MoE index of model layer `layer`, -1 for a dense one (or out of range).
  int moe_index(int layer) const;
  // The model layer number of MoE layer `moe_index` (a spec that lists no
  // layers, as a bare test shape's, numbers them alike).
  int model_layer(int moe_index) const {
    return moe_layers.empty() ? moe_index : moe_layers.at(std::size_t(moe_index));
  }
  // The model layer numbers of the dense layers, ascending.
  std::vector<int> dense_layers() const;
  // "model layers 0-2 are dense" or "" when every layer is an MoE layer.
  std::string describe_dense() const;
};

// The shape a spec comes with (what [model]'s shape keys hold).
struct ModelDims {
  std::int64_t layers = 0, experts = 0, top_k = 0, hidden = 0, ffn = 0;  // layers: MoE layers
  double norm_eps = 0;
};

struct HfConfig {
  ModelSpec spec;
  ModelDims dims;
  std::string torch_dtype;  // as config.json says ("bfloat16", "float32"), or empty
  // How the checkpoint stores its experts, from "quantization_config": "" (none: the
  // torch_dtype), "fp8" (DeepSeek-V3/R1: F8_E4M3 weights with an F32 weight_scale_inv
  // per 128x128 block) or "mxfp4" (gpt-oss: U8 blocks of 32 e2m1 values and e8m0 scales).
  std::string expert_format;
};
// Parses the text of config.json (`path` for messages): the family from
// "model_type" (unless `family` is given: set by hand), the shape and the
// router's and experts' parameters from the family's own keys, the expert
// format from "quantization_config". A missing, mistyped or contradictory key,
// or a quantization moed does not read, is an Input error naming the file and key.
HfConfig read_hf_config(const std::string& text, const std::string& path, const Family* family = nullptr);

// The keys [model] gives for synthetic weights, beyond the shape (0 or -1:
// the family's own default, see synthetic_spec).
struct SyntheticKeys {
  Family family = Family::mixtral;
  std::int64_t groups = 0, groups_kept = 0, shared_experts = -1, dense_layers = 0;
};
// The spec of a synthetic model of `dims` in family `keys.family`.
ModelSpec synthetic_spec(const SyntheticKeys& keys, const ModelDims& dims);

// config.json for `spec` and `dims`, as the family's own checkpoints write it
// (read_hf_config reads it back to the same spec and dims).
// `torch_dtype` is the tensors' ("float32", "bfloat16"); `expert_format` ("",
// "fp8", "mxfp4": HfConfig::expert_format) adds the quantization_config those
// checkpoints carry.
std::string hf_config_json(const ModelSpec& spec, const ModelDims& dims, std::string_view torch_dtype = "float32",
                           std::string_view expert_format = "");

// Checks that span the spec's parameters: groups divide the experts, top_k
// fits the experts the kept groups hold, ... `where` names the source
// ("config.json path", "[model]") in the Input error.
void check_spec(const ModelSpec& spec, const ModelDims& dims, const std::string& where);

}  // namespace moed::runtime
