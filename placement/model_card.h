// A model card: the facts of one published MoE model's config (its Hugging
// Face config.json), from which the memory planner sizes both sides of a
// disaggregated deployment: the experts moed serves, and the attention side
// (its weights and KV cache). TOML in configs/models/, every key declared
// once with its doc (docs/memory-planning.md#model-cards).
#pragma once

#include <cstdint>
#include <string>

namespace moed::placement {

struct CardModel {
  std::string name, source, dtype;
  std::int64_t layers = 0;        // decoder layers (num_hidden_layers)
  std::int64_t dense_layers = 0;  // of them with a dense FFN instead of experts (the first ones)
  std::int64_t hidden = 0, vocab = 0;
  bool tied_embeddings = false;
  std::string excludes;  // published weights the card leaves out (e.g. DeepSeek-V3's MTP module)
};

struct CardMoe {
  std::int64_t experts = 0, top_k = 0, expert_ffn = 0;
  std::int64_t shared_experts = 0, shared_expert_ffn = 0;
  std::int64_t dense_ffn = 0;  // FFN width of the dense layers
  bool expert_bias = false, router_bias = false;
  std::string expert_dtype;  // empty: [model].dtype
};

struct CardAttention {
  std::string kind;  // "gqa" (MHA when kv_heads = heads) or "mla"
  std::int64_t heads = 0, kv_heads = 0, head_dim = 0;
  std::int64_t q_lora_rank = 0, kv_lora_rank = 0, qk_rope_head_dim = 0, qk_nope_head_dim = 0, v_head_dim = 0;
  std::string qk_norm;  // "none", "head" (a norm of head_dim), "full" (over all heads)
  bool bias = false, sinks = false;
  std::int64_t sliding_window = 0, sliding_layers = 0;  // layers whose KV is capped at the window
};

struct CardPublished {
  double total_params = 0, active_params = 0;
  bool active_counts_input_embedding = true;  // the authors' convention for "active"
  std::string source;
};

struct ModelCard {
  CardModel model;
  CardMoe moe;
  CardAttention attention;
  CardPublished published;

  std::int64_t moe_layers() const { return model.layers - model.dense_layers; }
  const std::string& expert_dtype() const { return moe.expert_dtype.empty() ? model.dtype : moe.expert_dtype; }
};

// Parses and checks a card (a Usage error naming the key or the
// inconsistency, prefixed with `origin`). A missing file is an Input error.
ModelCard parse_model_card(const std::string& toml_text, const std::string& origin);
ModelCard read_model_card(const std::string& path);

}  // namespace moed::placement
