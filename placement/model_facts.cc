#include "placement/model_facts.h"

#include <algorithm>

#include "common/saturating.h"

namespace moed::placement {

namespace {

using U = std::uint64_t;

U attention_per_layer(const ModelCard& c) {
  const CardAttention& a = c.attention;
  const U H = U(c.model.hidden), heads = U(a.heads);
  U n = 0;
  if (a.kind == "gqa") {
    const U q = heads * U(a.head_dim), kv = U(a.kv_heads) * U(a.head_dim);
    n = H * q + 2 * H * kv + q * H;
    if (a.bias) n += q + 2 * kv + H;
    if (a.qk_norm == "head") n += 2 * U(a.head_dim);
    if (a.qk_norm == "full") n += q + kv;
  } else {
    const U qk_head = U(a.qk_nope_head_dim + a.qk_rope_head_dim), latent = U(a.kv_lora_rank);
    // Queries through the low-rank compression (with its norm) or directly.
    n += a.q_lora_rank ? H * U(a.q_lora_rank) + U(a.q_lora_rank) + U(a.q_lora_rank) * heads * qk_head
                       : H * heads * qk_head;
    n += H * (latent + U(a.qk_rope_head_dim)) + latent;                   // kv_a_proj_with_mqa, its norm
    n += latent * heads * U(a.qk_nope_head_dim + a.v_head_dim);          // kv_b_proj
    n += heads * U(a.v_head_dim) * H;                                   // o_proj
  }
  if (a.sinks) n += heads;
  return n;
}

U swiglu(U hidden, U ffn, bool bias) { return 3 * hidden * ffn + (bias ? 2 * ffn + hidden : 0); }

}  // namespace

ParameterCount count_parameters(const ModelCard& c) {
  ParameterCount p;
  const U H = U(c.model.hidden), L = U(c.model.layers), moe = U(c.moe_layers()), dense = U(c.model.dense_layers);
  const U table = U(c.model.vocab) * H;
  p.embeddings = c.model.tied_embeddings ? table : 2 * table;
  p.attention_per_layer = attention_per_layer(c);
  p.attention = L * p.attention_per_layer;
  p.dense_ffn = dense * swiglu(H, U(c.moe.dense_ffn), false);
  p.one_expert = swiglu(H, U(c.moe.expert_ffn), c.moe.expert_bias);
  p.routed_experts = moe * U(c.moe.experts) * p.one_expert;
  p.shared_experts = moe * U(c.moe.shared_experts) * swiglu(H, U(c.moe.shared_expert_ffn), c.moe.expert_bias);
  p.routers = moe * U(c.moe.experts) * (H + (c.moe.router_bias ? 1 : 0));
  p.norms = 2 * L * H + H;
  const U common = p.embeddings + p.attention + p.dense_ffn + p.shared_experts + p.routers + p.norms;
  p.total = common + p.routed_experts;
  p.active = common + moe * U(c.moe.top_k) * p.one_expert;
  p.active_without_input_embedding = p.active - (c.model.tied_embeddings ? 0 : table);
  return p;
}

KvCache kv_cache(const ModelCard& c, std::uint64_t element_bytes) {
  const CardAttention& a = c.attention;
  KvCache kv;
  kv.per_layer_token = a.kind == "gqa" ? 2 * U(a.kv_heads) * U(a.head_dim) * element_bytes
                                       : U(a.kv_lora_rank + a.qk_rope_head_dim) * element_bytes;
  kv.per_token = U(c.model.layers) * kv.per_layer_token;
  return kv;
}

std::uint64_t KvCache::at_context(std::uint64_t context, const ModelCard& c) const {
  const U sliding = U(c.attention.sliding_layers), full = U(c.model.layers) - sliding;
  const U windowed = std::min(context, U(c.attention.sliding_window));
  return saturating_add(saturating_mul({full, context, per_layer_token}),
                        saturating_mul({sliding, windowed, per_layer_token}));
}

}  // namespace moed::placement
