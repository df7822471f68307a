// What a model card implies: its parameters (total, and active per token) and
// the attention side's KV cache, computed from the card's dimensions alone.
//
// Parameters count every weight of the published checkpoint except what the
// card's [model].excludes names (DeepSeek-V3's multi-token-prediction
// module): the embeddings (twice when untied: input table and output
// projection), per layer the attention (projections, their biases, the
// latent norms of MLA, query/key norms, sinks), the two RMSNorms, the dense
// FFN or the experts (routed, shared, their biases) and the router (and its
// bias), and the final norm. Active per token: the same with top_k routed
// experts instead of all of them; `active_without_input_embedding` leaves out
// the input table (a lookup, not a product), as OpenAI counts gpt-oss.
#pragma once

#include <cstdint>

#include "placement/model_card.h"

namespace moed::placement {

struct ParameterCount {
  std::uint64_t embeddings = 0;      // input table + output projection (once when tied)
  std::uint64_t attention = 0;       // all layers
  std::uint64_t dense_ffn = 0;       // the dense layers' FFNs
  std::uint64_t routed_experts = 0;  // all layers, all experts
  std::uint64_t shared_experts = 0;
  std::uint64_t routers = 0;
  std::uint64_t norms = 0;           // per layer and the final one
  std::uint64_t total = 0;
  std::uint64_t active = 0;                           // per token
  std::uint64_t active_without_input_embedding = 0;
  std::uint64_t one_expert = 0;                       // one routed expert of one layer
  std::uint64_t attention_per_layer = 0;
};

ParameterCount count_parameters(const ModelCard& card);

// KV cache of one sequence, `element_bytes` per cached number (2 for bf16).
// GQA: 2 (K and V) x kv_heads x head_dim per layer and token. MLA: the
// compressed latent and the shared rotary key, kv_lora_rank +
// qk_rope_head_dim per layer and token (what DeepSeek caches; the heads are
// re-expanded from it). Sliding-window layers hold at most the window.
struct KvCache {
  std::uint64_t per_token = 0;      // every layer, for a token within every window
  std::uint64_t per_layer_token = 0;  // one layer
  std::uint64_t at_context(std::uint64_t context, const ModelCard& card) const;
};
KvCache kv_cache(const ModelCard& card, std::uint64_t element_bytes);

}  // namespace moed::placement
