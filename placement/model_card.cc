#include "placement/model_card.h"

#include <fstream>
#include <sstream>

#include "common/config_table.h"
#include "common/error.h"
#include "common/quote.h"
#include "placement/weight_format.h"

namespace moed::placement {

namespace {

using namespace config;
constexpr std::int64_t kBig = std::int64_t(1) << 30;

std::vector<std::string> or_empty(std::vector<std::string> names) {
  names.insert(names.begin(), "");
  return names;
}

const Section<CardModel>& model_section() {
  using S = CardModel;
  static const Section<S> s{
      "model",
      "the model as a whole",
      {text<S>("name", &S::name, "", "the model's name"),
       text<S>("source", &S::source, "", "where the facts come from (its config.json)"),
       choice<S>("dtype", &S::dtype, "bf16", weight_format_names(),
                 "format of the published weights (torch_dtype, or the quantisation)"),
       integer<S>("layers", &S::layers, 0, 1, 4096, "decoder layers (num_hidden_layers)"),
       integer<S>("dense_layers", &S::dense_layers, 0, 0, 4096,
                  "leading layers with a dense FFN instead of experts (first_k_dense_replace)"),
       integer<S>("hidden", &S::hidden, 0, 1, kBig, "hidden size"),
       integer<S>("vocab", &S::vocab, 0, 1, kBig, "vocabulary size"),
       flag<S>("tied_embeddings", &S::tied_embeddings, false, "the output projection is the input embedding"),
       text<S>("excludes", &S::excludes, "", "published weights this card does not count")}};
  return s;
}

const Section<CardMoe>& moe_section() {
  using S = CardMoe;
  static const Section<S> s{
      "moe",
      "the expert layers",
      {integer<S>("experts", &S::experts, 0, 1, 65536, "routed experts per MoE layer"),
       integer<S>("top_k", &S::top_k, 0, 1, 65536, "routed experts per token"),
       integer<S>("expert_ffn", &S::expert_ffn, 0, 1, kBig, "a routed expert's FFN width (moe_intermediate_size)"),
       integer<S>("shared_experts", &S::shared_experts, 0, 0, 65536, "experts every token goes through"),
       integer<S>("shared_expert_ffn", &S::shared_expert_ffn, 0, 0, kBig, "a shared expert's FFN width"),
       integer<S>("dense_ffn", &S::dense_ffn, 0, 0, kBig, "the dense layers' FFN width (intermediate_size)"),
       flag<S>("expert_bias", &S::expert_bias, false, "the experts' projections have biases"),
       flag<S>("router_bias", &S::router_bias, false, "the router has a bias per expert"),
       choice<S>("expert_dtype", &S::expert_dtype, "", or_empty(weight_format_names()),
                 "format of the published expert weights (empty: [model].dtype)")}};
  return s;
}

const Section<CardAttention>& attention_section() {
  using S = CardAttention;
  static const Section<S> s{
      "attention",
      "the attention side",
      {choice<S>("kind", &S::kind, "gqa", {"gqa", "mla"}, "grouped-query (MHA when kv_heads = heads) or MLA"),
       integer<S>("heads", &S::heads, 0, 1, 65536, "query heads"),
       integer<S>("kv_heads", &S::kv_heads, 0, 0, 65536, "gqa: key/value heads"),
       integer<S>("head_dim", &S::head_dim, 0, 0, 65536, "gqa: dimension of one head"),
       integer<S>("q_lora_rank", &S::q_lora_rank, 0, 0, kBig, "mla: rank of the query compression (0: none)"),
       integer<S>("kv_lora_rank", &S::kv_lora_rank, 0, 0, kBig, "mla: rank of the key/value latent"),
       integer<S>("qk_rope_head_dim", &S::qk_rope_head_dim, 0, 0, 65536, "mla: rotary part of a query/key head"),
       integer<S>("qk_nope_head_dim", &S::qk_nope_head_dim, 0, 0, 65536, "mla: non-rotary part of a query/key head"),
       integer<S>("v_head_dim", &S::v_head_dim, 0, 0, 65536, "mla: dimension of a value head"),
       choice<S>("qk_norm", &S::qk_norm, "none", {"none", "head", "full"},
                 "norms on queries and keys: per head (Qwen3) or over all heads (OLMoE)"),
       flag<S>("bias", &S::bias, false, "the projections have biases"),
       flag<S>("sinks", &S::sinks, false, "one learned sink logit per head (gpt-oss)"),
       integer<S>("sliding_window", &S::sliding_window, 0, 0, kBig, "tokens a sliding-window layer attends to"),
       integer<S>("sliding_layers", &S::sliding_layers, 0, 0, 4096, "layers with the sliding window")}};
  return s;
}

const Section<CardPublished>& published_section() {
  using S = CardPublished;
  static const Section<S> s{
      "published",
      "the parameter counts the authors published, to check the card against",
      {real<S>("total_params", &S::total_params, 0, 0, 1e15, "total parameters"),
       real<S>("active_params", &S::active_params, 0, 0, 1e15, "parameters active per token"),
       flag<S>("active_counts_input_embedding", &S::active_counts_input_embedding, true,
               "the authors' active count includes the input embedding table"),
       text<S>("source", &S::source, "", "where the authors published them")}};
  return s;
}

const Schema<ModelCard>& card_schema() {
  static const Schema<ModelCard> schema = [] {
    Schema<ModelCard> s;
    s.add(model_section(), &ModelCard::model);
    s.add(moe_section(), &ModelCard::moe);
    s.add(attention_section(), &ModelCard::attention);
    s.add(published_section(), &ModelCard::published);
    return s;
  }();
  return schema;
}

void check(bool ok, const std::string& origin, const std::string& what) {
  if (!ok) MOED_THROW(Usage, "{}: {}", origin, what);
}

void validate(const ModelCard& c, const std::string& origin) {
  check(!c.model.name.empty(), origin, "[model].name is required");
  check(!c.model.source.empty(), origin, "[model].source is required: where the facts come from");
  check(c.model.layers > 0 && c.model.hidden > 0 && c.model.vocab > 0, origin,
        "[model].layers, [model].hidden and [model].vocab are required");
  check(c.model.dense_layers < c.model.layers, origin, "[model].dense_layers must leave at least one MoE layer");
  check(c.moe.experts > 0 && c.moe.top_k > 0 && c.moe.expert_ffn > 0, origin,
        "[moe].experts, [moe].top_k and [moe].expert_ffn are required");
  check(c.moe.top_k <= c.moe.experts, origin, "[moe].top_k exceeds [moe].experts");
  check((c.moe.shared_experts > 0) == (c.moe.shared_expert_ffn > 0), origin,
        "[moe].shared_experts and [moe].shared_expert_ffn go together");
  check((c.model.dense_layers > 0) == (c.moe.dense_ffn > 0), origin,
        "[model].dense_layers and [moe].dense_ffn go together");
  const CardAttention& a = c.attention;
  if (a.kind == "gqa") {
    check(a.kv_heads > 0 && a.head_dim > 0, origin, "gqa attention needs [attention].kv_heads and head_dim");
    check(a.heads % a.kv_heads == 0, origin, "[attention].heads is not a multiple of kv_heads");
    check(a.kv_lora_rank == 0 && a.q_lora_rank == 0, origin, "the lora ranks are for mla attention");
  } else {
    check(a.kv_lora_rank > 0 && a.qk_rope_head_dim > 0 && a.qk_nope_head_dim > 0 && a.v_head_dim > 0, origin,
          "mla attention needs [attention].kv_lora_rank, qk_rope_head_dim, qk_nope_head_dim and v_head_dim");
    check(a.kv_heads == 0 && a.head_dim == 0, origin, "kv_heads and head_dim are for gqa attention (mla: the lora dims)");
  }
  check(a.sliding_layers <= c.model.layers, origin, "[attention].sliding_layers exceeds [model].layers");
  check((a.sliding_layers > 0) == (a.sliding_window > 0), origin,
        "[attention].sliding_window and sliding_layers go together");
  check(c.published.total_params >= c.published.active_params, origin,
        "[published].active_params exceeds total_params");
}

}  // namespace

ModelCard parse_model_card(const std::string& toml_text, const std::string& origin) {
  const Schema<ModelCard>& schema = card_schema();
  ModelCard card = schema.defaults();
  schema.load(detail::parse_toml(toml_text, origin), card, origin);
  validate(card, origin);
  return card;
}

ModelCard read_model_card(const std::string& path) {
  std::ifstream in(path);
  if (!in) MOED_THROW(Input, "model card {}: cannot read it", quote_input(path));
  std::ostringstream text;
  text << in.rdbuf();
  return parse_model_card(text.str(), path);
}

}  // namespace moed::placement
