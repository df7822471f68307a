// The model families' specs (runtime/config/model_family.h): each family's
// config.json read into the router and expert parameters its reference code
// uses, the layer numbers of its MoE layers, the refusals of a bad
// config.json (naming the file and key), the expert format its
// quantization_config names, and config.json written back for a synthetic
// model reading back to the same spec.
#include "runtime/config/model_family.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/error.h"
#include "tests/unit/test_support.h"

namespace moed::runtime {
namespace {

using test::expect_error;

HfConfig read(const std::string& json) { return read_hf_config(json, "ck/config.json"); }

// DeepSeek-V3's own config.json, less what moed does not read.
const char* kDeepSeekV3 = R"({
  "model_type": "deepseek_v3", "num_hidden_layers": 61, "hidden_size": 7168, "intermediate_size": 18432,
  "moe_intermediate_size": 2048, "n_routed_experts": 256, "n_shared_experts": 1, "num_experts_per_tok": 8,
  "n_group": 8, "topk_group": 4, "topk_method": "noaux_tc", "scoring_func": "sigmoid", "norm_topk_prob": true,
  "routed_scaling_factor": 2.5, "first_k_dense_replace": 3, "moe_layer_freq": 1, "rms_norm_eps": 1e-06,
  "torch_dtype": "bfloat16"})";

TEST(HfConfig, DeepSeekV3IsASigmoidRouterWithBiasGroupsScalingASharedExpertAndDenseLayers) {
  const HfConfig hf = read(kDeepSeekV3);
  const ModelSpec& s = hf.spec;
  EXPECT_EQ(s.family, Family::deepseek_v3);
  EXPECT_EQ(s.router.scoring, Scoring::sigmoid);
  EXPECT_TRUE(s.router.selection_bias);
  EXPECT_FALSE(s.router.gate_bias);
  EXPECT_EQ(s.router.groups, 8);
  EXPECT_EQ(s.router.groups_kept, 4);
  EXPECT_TRUE(s.router.renormalize);
  EXPECT_DOUBLE_EQ(s.router.scaling, 2.5);
  EXPECT_FALSE(s.router.softmax_after_topk);
  EXPECT_EQ(s.expert.activation, Activation::swiglu);
  EXPECT_FALSE(s.expert.biases);
  EXPECT_EQ(s.shared_ffn, 2048);
  EXPECT_FALSE(s.shared_gated);
  EXPECT_EQ(s.dense_ffn, 18432);
  EXPECT_EQ(s.model_layers, 61);
  ASSERT_EQ(s.moe_layers.size(), 58u);
  EXPECT_EQ(s.moe_layers.front(), 3);
  EXPECT_EQ(s.moe_layers.back(), 60);
  EXPECT_EQ(s.moe_index(2), -1);
  EXPECT_EQ(s.moe_index(3), 0);
  EXPECT_EQ(s.model_layer(57), 60);
  EXPECT_EQ(s.describe_dense(), "model layers 0, 1, 2 are dense");
  EXPECT_EQ(hf.dims.layers, 58);
  EXPECT_EQ(hf.dims.experts, 256);
  EXPECT_EQ(hf.dims.top_k, 8);
  EXPECT_EQ(hf.dims.hidden, 7168);
  EXPECT_EQ(hf.dims.ffn, 2048);
  EXPECT_DOUBLE_EQ(hf.dims.norm_eps, 1e-6);
  EXPECT_EQ(hf.torch_dtype, "bfloat16");
}

TEST(HfConfig, Qwen3MoeRenormalisesWhenToldAndSkipsItsMlpOnlyLayers) {
  const HfConfig hf = read(R"({"model_type": "qwen3_moe", "num_hidden_layers": 6, "hidden_size": 2048,
    "intermediate_size": 6144, "moe_intermediate_size": 768, "num_experts": 128, "num_experts_per_tok": 8,
    "norm_topk_prob": true, "decoder_sparse_step": 1, "mlp_only_layers": [0, 4]})");
  EXPECT_EQ(hf.spec.family, Family::qwen3_moe);
  EXPECT_EQ(hf.spec.router.scoring, Scoring::softmax);
  EXPECT_TRUE(hf.spec.router.renormalize);
  EXPECT_EQ(hf.spec.shared_ffn, 0);
  EXPECT_EQ(hf.spec.moe_layers, (std::vector<int>{1, 2, 3, 5}));
  EXPECT_EQ(hf.dims.ffn, 768);
  EXPECT_EQ(hf.dims.experts, 128);
}

TEST(HfConfig, DecoderSparseStepKeepsEveryStepthLayer) {
  const HfConfig hf = read(R"({"model_type": "qwen3_moe", "num_hidden_layers": 6, "hidden_size": 64,
    "intermediate_size": 256, "moe_intermediate_size": 32, "num_experts": 8, "num_experts_per_tok": 2,
    "decoder_sparse_step": 2})");
  // transformers: layer L is sparse when (L + 1) % decoder_sparse_step == 0.
  EXPECT_EQ(hf.spec.moe_layers, (std::vector<int>{1, 3, 5}));
  EXPECT_FALSE(hf.spec.router.renormalize);  // transformers' default
}

TEST(HfConfig, Qwen2MoeHasASigmoidGatedSharedExpertAndNoRenormalisation) {
  const HfConfig hf = read(R"({"model_type": "qwen2_moe", "num_hidden_layers": 24, "hidden_size": 2048,
    "intermediate_size": 5632, "moe_intermediate_size": 1408, "shared_expert_intermediate_size": 5632,
    "num_experts": 60, "num_experts_per_tok": 4, "norm_topk_prob": false})");
  EXPECT_EQ(hf.spec.family, Family::qwen2_moe);
  EXPECT_FALSE(hf.spec.router.renormalize);
  EXPECT_TRUE(hf.spec.shared_gated);
  EXPECT_EQ(hf.spec.shared_ffn, 5632);
  EXPECT_EQ(hf.spec.moe_layers.size(), 24u);
}

TEST(HfConfig, OlmoeIsASoftmaxTopKWithoutRenormalisation) {
  const HfConfig hf = read(R"({"model_type": "olmoe", "num_hidden_layers": 16, "hidden_size": 2048,
    "intermediate_size": 1024, "num_experts": 64, "num_experts_per_tok": 8, "norm_topk_prob": false,
    "rms_norm_eps": 1e-05})");
  EXPECT_EQ(hf.spec.family, Family::olmoe);
  EXPECT_FALSE(hf.spec.router.renormalize);
  EXPECT_EQ(hf.spec.shared_ffn, 0);
  EXPECT_EQ(hf.dims.ffn, 1024);
  EXPECT_EQ(hf.dims.experts, 64);
}

TEST(HfConfig, GptOssHasARouterBiasSoftmaxAfterTopKBiasedClampedInterleavedExperts) {
  const HfConfig hf = read(R"({"model_type": "gpt_oss", "num_hidden_layers": 24, "hidden_size": 2880,
    "intermediate_size": 2880, "num_local_experts": 32, "num_experts_per_tok": 4, "swiglu_limit": 7.0})");
  const ModelSpec& s = hf.spec;
  EXPECT_EQ(s.family, Family::gpt_oss);
  EXPECT_TRUE(s.router.gate_bias);
  EXPECT_TRUE(s.router.softmax_after_topk);
  EXPECT_EQ(s.expert.activation, Activation::clamped_swiglu);
  EXPECT_TRUE(s.expert.biases);
  EXPECT_TRUE(s.expert.interleaved);
  EXPECT_DOUBLE_EQ(s.expert.limit, 7.0);
  EXPECT_DOUBLE_EQ(s.expert.alpha, 1.702);
  EXPECT_EQ(hf.dims.experts, 32);
}

TEST(HfConfig, MixtralIsTheDefaultRouter) {
  const HfConfig hf = read(R"({"model_type": "mixtral", "num_hidden_layers": 32, "hidden_size": 4096,
    "intermediate_size": 14336, "num_local_experts": 8, "num_experts_per_tok": 2})");
  EXPECT_EQ(hf.spec.family, Family::mixtral);
  EXPECT_TRUE(hf.spec.router.renormalize);
  EXPECT_DOUBLE_EQ(hf.spec.router.scaling, 1.0);
  EXPECT_EQ(hf.dims.ffn, 14336);
}

TEST(HfConfig, AFamilySetByHandOverridesModelType) {
  const Family forced = Family::olmoe;
  const HfConfig hf = read_hf_config(R"({"num_hidden_layers": 2, "hidden_size": 64, "intermediate_size": 32,
    "num_experts": 8, "num_experts_per_tok": 2})", "ck/config.json", &forced);
  EXPECT_EQ(hf.spec.family, Family::olmoe);
}

// ---- quantization_config: the expert format ----------------------------------------------

// kDeepSeekV3 with `more` keys added.
std::string deepseek_v3_with(const std::string& more) {
  std::string text = kDeepSeekV3;
  return text.substr(0, text.rfind('}')) + ", " + more + "}";
}

TEST(HfConfig, NoQuantizationConfigMeansUnquantizedExperts) {
  EXPECT_EQ(read(kDeepSeekV3).expert_format, "");
  EXPECT_EQ(read(deepseek_v3_with(R"("quantization_config": null)")).expert_format, "");
}

TEST(HfConfig, DeepSeekV3sFp8QuantizationConfigIsFp8) {
  // As DeepSeek-V3's and R1's config.json carry it.
  const HfConfig hf = read(deepseek_v3_with(R"("quantization_config": {"activation_scheme": "dynamic",
    "fmt": "e4m3", "quant_method": "fp8", "weight_block_size": [128, 128]})"));
  EXPECT_EQ(hf.expert_format, "fp8");
  EXPECT_EQ(hf.torch_dtype, "bfloat16");
  EXPECT_EQ(hf.spec.family, Family::deepseek_v3);
  // fmt and weight_block_size may be left out: e4m3 and 128x128 are what fp8 means then.
  EXPECT_EQ(read(deepseek_v3_with(R"("quantization_config": {"quant_method": "fp8"})")).expert_format, "fp8");
}

TEST(HfConfig, GptOsssMxfp4QuantizationConfigIsMxfp4) {
  // As gpt-oss's config.json carries it: the modules left in bf16 are the loader's business.
  const HfConfig hf = read(R"({"model_type": "gpt_oss", "num_hidden_layers": 24, "hidden_size": 2880,
    "intermediate_size": 2880, "num_local_experts": 32, "num_experts_per_tok": 4,
    "quantization_config": {"modules_to_not_convert": ["model.layers.*.self_attn", "model.layers.*.mlp.router",
      "model.embed_tokens", "lm_head"], "quant_method": "mxfp4"}})");
  EXPECT_EQ(hf.expert_format, "mxfp4");
  EXPECT_EQ(hf.spec.family, Family::gpt_oss);
}

struct BadConfig {
  const char* name;
  std::string json;
  std::vector<std::string> parts;  // what the refusal names
};

class HfConfigRefuses : public ::testing::TestWithParam<BadConfig> {};

TEST_P(HfConfigRefuses, NamingTheFileAndKey) {
  std::vector<std::string> parts = GetParam().parts;
  parts.emplace_back("ck/config.json");
  expect_error([&] { read(GetParam().json); }, ErrorKind::Input, parts);
}

const char* kDeepSeekBase = R"("model_type": "deepseek_v3", "num_hidden_layers": 4, "hidden_size": 64,
  "intermediate_size": 256, "moe_intermediate_size": 32, "n_routed_experts": 16, "n_shared_experts": 1)";

std::string deepseek(const std::string& more) { return std::string("{") + kDeepSeekBase + ", " + more + "}"; }

INSTANTIATE_TEST_SUITE_P(
    Bad, HfConfigRefuses,
    ::testing::Values(
        BadConfig{"NotJson", "{model_type: mixtral", {"not valid JSON"}},
        BadConfig{"NotAnObject", "[1, 2]", {"expected an object"}},
        BadConfig{"NoModelType", R"({"num_hidden_layers": 2})", {"model_type", "[model].family"}},
        BadConfig{"UnknownModelType", R"({"model_type": "llama4"})", {"\"llama4\"", "deepseek_v3"}},
        BadConfig{"MissingHiddenSize",
                  R"({"model_type": "olmoe", "num_hidden_layers": 2, "intermediate_size": 32, "num_experts": 8,
                      "num_experts_per_tok": 2})",
                  {"\"hidden_size\""}},
        BadConfig{"MistypedTopK",
                  R"({"model_type": "olmoe", "num_hidden_layers": 2, "hidden_size": 64, "intermediate_size": 32,
                      "num_experts": 8, "num_experts_per_tok": "two"})",
                  {"\"num_experts_per_tok\"", "\"two\""}},
        BadConfig{"GroupsThatDoNotDivideTheExperts", deepseek(R"("num_experts_per_tok": 2, "n_group": 3, "topk_group": 1)"),
                  {"n_group", "= 3", "16 experts"}},
        BadConfig{"TopKGroupOverNGroup", deepseek(R"("num_experts_per_tok": 2, "n_group": 4, "topk_group": 5)"),
                  {"topk_group", "= 5"}},
        BadConfig{"TopKOverWhatTheKeptGroupsHold", deepseek(R"("num_experts_per_tok": 6, "n_group": 4, "topk_group": 1)"),
                  {"num_experts_per_tok", "6", "4 experts"}},
        BadConfig{"TopKOverTheExperts",
                  R"({"model_type": "olmoe", "num_hidden_layers": 2, "hidden_size": 64, "intermediate_size": 32,
                      "num_experts": 8, "num_experts_per_tok": 9})",
                  {"top_k 9", "8 experts"}},
        BadConfig{"UnknownScoringFunc", deepseek(R"("num_experts_per_tok": 2, "scoring_func": "relu")"),
                  {"\"scoring_func\"", "relu"}},
        BadConfig{"UnknownTopKMethod", deepseek(R"("num_experts_per_tok": 2, "topk_method": "best")"),
                  {"\"topk_method\"", "best"}},
        BadConfig{"NoMoeLayerLeft",
                  std::string("{") + kDeepSeekBase + R"(, "num_experts_per_tok": 2, "first_k_dense_replace": 4})",
                  {"no layer"}},
        BadConfig{"MlpOnlyLayerOutOfRange",
                  R"({"model_type": "qwen3_moe", "num_hidden_layers": 2, "hidden_size": 64, "intermediate_size": 32,
                      "moe_intermediate_size": 16, "num_experts": 8, "num_experts_per_tok": 2,
                      "mlp_only_layers": [7]})",
                  {"\"mlp_only_layers\""}},
        BadConfig{"NegativeScaling", deepseek(R"("num_experts_per_tok": 2, "routed_scaling_factor": -1)"),
                  {"\"routed_scaling_factor\""}},
        BadConfig{"QuantizationConfigNotAnObject",
                  deepseek(R"("num_experts_per_tok": 2, "quantization_config": "fp8")"),
                  {"\"quantization_config\" is \"fp8\"", "expected an object"}},
        BadConfig{"NoQuantMethod",
                  deepseek(R"("num_experts_per_tok": 2, "quantization_config": {"fmt": "e4m3"})"),
                  {"quantization_config", "\"quant_method\"", "\"fp8\", \"mxfp4\""}},
        BadConfig{"UnknownQuantMethod",
                  deepseek(R"("num_experts_per_tok": 2, "quantization_config": {"quant_method": "awq", "bits": 4})"),
                  {"quantization_config.quant_method is \"awq\"", "\"fp8\", \"mxfp4\""}},
        BadConfig{"QuantMethodNotAString",
                  deepseek(R"("num_experts_per_tok": 2, "quantization_config": {"quant_method": 8})"),
                  {"quantization_config.quant_method is 8", "\"fp8\", \"mxfp4\""}},
        BadConfig{"Fp8OfAnotherFormat",
                  deepseek(R"("num_experts_per_tok": 2, "quantization_config": {"quant_method": "fp8",
                              "fmt": "e5m2"})"),
                  {"quantization_config.fmt is \"e5m2\"", "e4m3"}},
        BadConfig{"Fp8WithOtherBlocks",
                  deepseek(R"("num_experts_per_tok": 2, "quantization_config": {"quant_method": "fp8",
                              "weight_block_size": [64, 64]})"),
                  {"quantization_config.weight_block_size is [64, 64]; moed reads fp8 with 128x128 block scales"}},
        BadConfig{"Fp8PerTensor",
                  deepseek(R"("num_experts_per_tok": 2, "quantization_config": {"quant_method": "fp8",
                              "weight_block_size": null})"),
                  {"quantization_config.weight_block_size is null", "128x128"}}),
    [](const ::testing::TestParamInfo<BadConfig>& info) { return std::string(info.param.name); });

class SyntheticSpecs : public ::testing::TestWithParam<Family> {};

TEST_P(SyntheticSpecs, WrittenAsConfigJsonReadBackTheSame) {
  const ModelDims dims{3, 16, 4, 64, 32, 1e-5};
  const Family f = GetParam();
  const bool dense = f == Family::deepseek_v3 || f == Family::qwen3_moe || f == Family::qwen2_moe;
  const ModelSpec s = synthetic_spec({f, 0, 0, -1, dense ? 1 : 0}, dims);
  const HfConfig back = read(hf_config_json(s, dims, "bfloat16"));
  EXPECT_EQ(back.spec.family, s.family);
  EXPECT_EQ(back.spec.moe_layers, s.moe_layers);
  EXPECT_EQ(back.spec.model_layers, s.model_layers);
  EXPECT_EQ(back.spec.router.scoring, s.router.scoring);
  EXPECT_EQ(back.spec.router.selection_bias, s.router.selection_bias);
  EXPECT_EQ(back.spec.router.gate_bias, s.router.gate_bias);
  EXPECT_EQ(back.spec.router.groups, s.router.groups);
  EXPECT_EQ(back.spec.router.groups_kept, s.router.groups_kept);
  EXPECT_EQ(back.spec.router.renormalize, s.router.renormalize);
  EXPECT_DOUBLE_EQ(back.spec.router.scaling, s.router.scaling);
  EXPECT_EQ(back.spec.router.softmax_after_topk, s.router.softmax_after_topk);
  EXPECT_EQ(back.spec.expert.activation, s.expert.activation);
  EXPECT_EQ(back.spec.expert.biases, s.expert.biases);
  EXPECT_EQ(back.spec.shared_ffn, s.shared_ffn);
  EXPECT_EQ(back.spec.shared_gated, s.shared_gated);
  EXPECT_EQ(back.dims.layers, dims.layers);
  EXPECT_EQ(back.dims.experts, dims.experts);
  EXPECT_EQ(back.dims.top_k, dims.top_k);
  EXPECT_EQ(back.dims.hidden, dims.hidden);
  EXPECT_EQ(back.dims.ffn, dims.ffn);
  EXPECT_DOUBLE_EQ(back.dims.norm_eps, dims.norm_eps);
  EXPECT_EQ(back.torch_dtype, "bfloat16");
}

INSTANTIATE_TEST_SUITE_P(Families, SyntheticSpecs,
                         ::testing::Values(Family::mixtral, Family::deepseek_v3, Family::qwen3_moe, Family::qwen2_moe,
                                           Family::olmoe, Family::gpt_oss),
                         [](const ::testing::TestParamInfo<Family>& info) { return std::string(name_of(info.param)); });

TEST(HfConfigJson, WritesEachExpertFormatsQuantizationConfigAndReadsItBack) {
  const ModelDims dims{3, 16, 4, 64, 32, 1e-5};
  const ModelSpec s = synthetic_spec({Family::deepseek_v3, 0, 0, -1, 1}, dims);
  // Unquantized, as before: no quantization_config at all.
  const auto plain = nlohmann::json::parse(hf_config_json(s, dims));
  EXPECT_FALSE(plain.contains("quantization_config"));
  EXPECT_EQ(read(hf_config_json(s, dims)).expert_format, "");
  EXPECT_EQ(read(hf_config_json(s, dims, "bfloat16", "")).expert_format, "");

  // fp8 exactly as DeepSeek-V3's checkpoints write it.
  const std::string fp8 = hf_config_json(s, dims, "bfloat16", "fp8");
  EXPECT_EQ(nlohmann::json::parse(fp8).at("quantization_config"),
            nlohmann::json::parse(R"({"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                                      "weight_block_size": [128, 128]})"));
  const HfConfig back = read(fp8);
  EXPECT_EQ(back.expert_format, "fp8");
  EXPECT_EQ(back.torch_dtype, "bfloat16");
  EXPECT_EQ(back.spec.moe_layers, s.moe_layers);

  const ModelSpec oss = synthetic_spec({Family::gpt_oss, 0, 0, -1, 0}, dims);
  const std::string mxfp4 = hf_config_json(oss, dims, "bfloat16", "mxfp4");
  EXPECT_EQ(nlohmann::json::parse(mxfp4).at("quantization_config"),
            nlohmann::json::parse(R"({"quant_method": "mxfp4"})"));
  EXPECT_EQ(read(mxfp4).expert_format, "mxfp4");
  EXPECT_EQ(read(mxfp4).spec.family, Family::gpt_oss);
}

TEST(HfConfigJson, AnExpertFormatMoedDoesNotWriteIsABug) {
  const ModelDims dims{3, 16, 4, 64, 32, 1e-5};
  const ModelSpec s = synthetic_spec({Family::mixtral, 0, 0, -1, 0}, dims);
  expect_error([&] { hf_config_json(s, dims, "bfloat16", "int4"); }, ErrorKind::Internal, {"int4", "fp8, mxfp4"});
}

TEST(SyntheticSpec, DeepSeekTakesTheMostGroupsOfAtLeastTwoAndKeepsHalf) {
  const ModelSpec s = synthetic_spec({Family::deepseek_v3, 0, 0, -1, 0}, {2, 256, 8, 64, 32, 1e-5});
  EXPECT_EQ(s.router.groups, 8);
  EXPECT_EQ(s.router.groups_kept, 4);
  EXPECT_EQ(s.shared_ffn, 32);  // one shared expert of the routed experts' F
  const ModelSpec small = synthetic_spec({Family::deepseek_v3, 0, 0, -1, 0}, {2, 6, 2, 64, 32, 1e-5});
  EXPECT_EQ(small.router.groups, 2);  // 6 = 2 groups of 3; 8 and 4 do not divide it
}

TEST(SyntheticSpec, ASharedExpertOnAFamilyWithoutOneIsAUsageError) {
  expect_error([] { synthetic_spec({Family::olmoe, 0, 0, 1, 0}, {2, 8, 2, 64, 32, 1e-5}); }, ErrorKind::Usage,
               {"[model].shared_experts", "olmoe"});
}

TEST(SyntheticSpec, DenseLayersOnAFamilyWithoutThemIsAUsageError) {
  for (Family f : {Family::mixtral, Family::olmoe, Family::gpt_oss})
    expect_error([f] { synthetic_spec({f, 0, 0, -1, 2}, {2, 8, 2, 64, 32, 1e-5}); }, ErrorKind::Usage,
                 {"[model].dense_layers", std::string(name_of(f))});
}

TEST(SyntheticSpec, DenseLayersComeFirst) {
  const ModelSpec s = synthetic_spec({Family::qwen3_moe, 0, 0, -1, 2}, {3, 8, 2, 64, 32, 1e-5});
  EXPECT_EQ(s.model_layers, 5);
  EXPECT_EQ(s.moe_layers, (std::vector<int>{2, 3, 4}));
  EXPECT_EQ(s.moe_index(1), -1);
  EXPECT_EQ(s.moe_index(4), 2);
  EXPECT_EQ(s.moe_index(5), -1);
  EXPECT_EQ(s.describe_dense(), "model layers 0, 1 are dense");
}

}  // namespace
}  // namespace moed::runtime
