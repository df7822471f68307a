// The model cards of configs/models/: each parses, and its parameter counts
// come within 2% of the totals its authors published (which they round to
// two or three digits); exact counts and KV cache figures worked out by hand
// for a few; bad cards refused naming what is wrong.
#include "placement/model_card.h"

#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "placement/model_facts.h"
#include "tests/unit/test_support.h"

namespace moed::placement {
namespace {

using test::expect_error;

const std::string kCards = std::string(MOED_TEST_DATA_DIR) + "/../../configs/models/";
constexpr double kTolerance = 0.02;

class PublishedCard : public ::testing::TestWithParam<const char*> {};

TEST_P(PublishedCard, ParametersMatchWhatTheAuthorsPublished) {
  const ModelCard card = read_model_card(kCards + GetParam());
  const ParameterCount n = count_parameters(card);
  ASSERT_GT(card.published.total_params, 0);
  ASSERT_GT(card.published.active_params, 0);
  const double total = double(n.total), published_total = card.published.total_params;
  const double active = double(card.published.active_counts_input_embedding ? n.active
                                                                            : n.active_without_input_embedding);
  EXPECT_LT(std::abs(total / published_total - 1), kTolerance) << card.model.name << ": " << total;
  EXPECT_LT(std::abs(active / card.published.active_params - 1), kTolerance) << card.model.name << ": " << active;
  // The parts add up, and the active count sits between the shared part and the total.
  EXPECT_EQ(n.total, n.embeddings + n.attention + n.dense_ffn + n.routed_experts + n.shared_experts + n.routers +
                         n.norms);
  EXPECT_LT(n.active, n.total);
  EXPECT_FALSE(card.model.source.empty());
  EXPECT_FALSE(card.published.source.empty());
}

INSTANTIATE_TEST_SUITE_P(Cards, PublishedCard,
                         ::testing::Values("mixtral-8x7b.toml", "mixtral-8x22b.toml", "deepseek-v3.toml",
                                           "qwen3-30b-a3b.toml", "qwen3-235b-a22b.toml", "olmoe-1b-7b.toml",
                                           "gpt-oss-120b.toml"));

TEST(ModelFacts, MixtralByHand) {
  const ModelCard c = read_model_card(kCards + "mixtral-8x7b.toml");
  const ParameterCount n = count_parameters(c);
  const std::uint64_t expert = 3ull * 4096 * 14336;
  const std::uint64_t attention = 4096ull * 4096 * 2 + 4096ull * 1024 * 2;  // q, o; k, v (8 of 32 heads)
  EXPECT_EQ(n.one_expert, expert);
  EXPECT_EQ(n.attention_per_layer, attention);
  const std::uint64_t per_layer_rest = attention + 8 * 4096 + 2 * 4096;  // router, two norms
  EXPECT_EQ(n.total, 32 * (8 * expert + per_layer_rest) + 2ull * 32000 * 4096 + 4096);
  EXPECT_EQ(n.active, 32 * (2 * expert + per_layer_rest) + 2ull * 32000 * 4096 + 4096);
  // GQA: 2 (K, V) x 32 layers x 8 KV heads x 128 x 2 bytes.
  const KvCache kv = kv_cache(c, 2);
  EXPECT_EQ(kv.per_token, 2u * 32 * 8 * 128 * 2);
  EXPECT_EQ(kv.at_context(1000, c), 1000u * 2 * 32 * 8 * 128 * 2);
}

TEST(ModelFacts, DeepSeekMlaByHand) {
  const ModelCard c = read_model_card(kCards + "deepseek-v3.toml");
  EXPECT_EQ(c.moe_layers(), 58);
  const ParameterCount n = count_parameters(c);
  // q_a, its norm, q_b (128 heads x 192); kv_a with the rope key, its norm, kv_b (128 x 256); o.
  EXPECT_EQ(n.attention_per_layer, 7168ull * 1536 + 1536 + 1536ull * 128 * 192 + 7168ull * 576 + 512 +
                                       512ull * 128 * 256 + 128ull * 128 * 7168);
  EXPECT_EQ(n.dense_ffn, 3ull * 3 * 7168 * 18432);
  EXPECT_EQ(n.shared_experts, 58ull * 3 * 7168 * 2048);
  EXPECT_EQ(n.routers, 58ull * 256 * (7168 + 1));
  // MLA caches the latent and the rope key, not heads: (512 + 64) x 61 layers x 2 bytes,
  // where the hidden-size formula would say 2 x 61 x 7168 x 2.
  EXPECT_EQ(kv_cache(c, 2).per_token, (512u + 64) * 61 * 2);
}

TEST(ModelFacts, SlidingLayersHoldAtMostTheWindow) {
  const ModelCard c = read_model_card(kCards + "gpt-oss-120b.toml");
  const KvCache kv = kv_cache(c, 2);
  EXPECT_EQ(kv.per_layer_token, 2u * 8 * 64 * 2);
  EXPECT_EQ(kv.at_context(100, c), 36u * 100 * kv.per_layer_token);
  EXPECT_EQ(kv.at_context(10000, c), (18u * 10000 + 18u * 128) * kv.per_layer_token);
  // OpenAI counts the active parameters without the input embedding table.
  const ParameterCount n = count_parameters(c);
  EXPECT_EQ(n.active - n.active_without_input_embedding, 201088ull * 2880);
}

// A small card with extra lines in its sections.
std::string card(const std::string& model = "", const std::string& moe = "",
                 const std::string& attention = "heads=2\nkv_heads=1\nhead_dim=4\n") {
  return "[model]\nname='t'\nsource='s'\nlayers=2\nhidden=8\nvocab=100\n" + model +
         "[moe]\nexperts=4\ntop_k=1\nexpert_ffn=16\n" + moe + "[attention]\n" + attention;
}

TEST(ModelCard, TiedEmbeddingsCountOnce) {
  const ParameterCount untied = count_parameters(parse_model_card(card(), "t.toml"));
  const ParameterCount tied = count_parameters(parse_model_card(card("tied_embeddings=true\n"), "t.toml"));
  EXPECT_EQ(untied.embeddings - tied.embeddings, 800u);
  EXPECT_EQ(tied.active, tied.active_without_input_embedding);
  EXPECT_EQ(untied.active - untied.active_without_input_embedding, 800u);
}

TEST(ModelCard, RefusesBadCardsNamingTheProblem) {
  EXPECT_NO_THROW(parse_model_card(card(), "t.toml"));
  const std::vector<std::pair<std::string, const char*>> cases = {
      {card() + "[moe2]\n", "unknown section [moe2]"},
      {card() + "[published]\nsorce='x'\n", "unknown key [published].sorce"},
      {card("", "", "heads=3\nkv_heads=2\nhead_dim=4\n"), "heads is not a multiple of kv_heads"},
      {card("", "", "kind='mla'\nheads=2\nkv_lora_rank=4\n"), "mla attention needs"},
      {card("", "", "heads=2\n"), "gqa attention needs"},
      {card("dense_layers=2\n"), "at least one MoE layer"},
      {card("dense_layers=1\n"), "[model].dense_layers and [moe].dense_ffn go together"},
      {card("", "shared_experts=1\n"), "shared_experts and [moe].shared_expert_ffn go together"},
      {card("", "top_k=5\n").replace(card("", "top_k=5\n").find("top_k=1\n"), 8, ""), "[moe].top_k exceeds"},
      {card("dtype='int3'\n"), "[model].dtype"},
      {card("", "", "heads=2\nkv_heads=1\nhead_dim=4\nsliding_window=128\n"),
       "sliding_window and sliding_layers go together"},
      {"[model]\nname='t'\nsource='s'\n[attention]\nheads=2\nkv_heads=1\nhead_dim=4\n",
       "[model].layers, [model].hidden and [model].vocab are required"},
      {card("layers=2\n"), "t.toml"},  // a key twice is TOML's own error, with the file
  };
  for (const auto& [text, what] : cases) {
    SCOPED_TRACE(text);
    expect_error([&] { parse_model_card(text, "t.toml"); }, ErrorKind::Usage, {what});
  }
  expect_error([] { read_model_card("/nonexistent/card.toml"); }, ErrorKind::Input, {"cannot read it"});
}

}  // namespace
}  // namespace moed::placement
