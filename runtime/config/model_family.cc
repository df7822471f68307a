#include "runtime/config/model_family.h"

#include <fmt/format.h>

#include <algorithm>
#include <iterator>
#include <nlohmann/json.hpp>
#include <string_view>

#include "common/error.h"

namespace moed::runtime {

namespace {

using json = nlohmann::ordered_json;

// config.json's keys, read with the file and key in every refusal.
class Keys {
 public:
  Keys(const json& j, std::string path) : j_(j), path_(std::move(path)) {}

  bool has(const char* key) const { return j_.contains(key) && !j_.at(key).is_null(); }
  std::int64_t integer(const char* key, std::int64_t min = 1) const {
    if (!has(key)) MOED_THROW(Input, "{}: no \"{}\", which a {} config.json needs", path_, key, family_);
    return checked_integer(key, j_.at(key), min);
  }
  std::int64_t integer_or(const char* key, std::int64_t fallback, std::int64_t min = 0) const {
    return has(key) ? checked_integer(key, j_.at(key), min) : fallback;
  }
  double real_or(const char* key, double fallback) const {
    if (!has(key)) return fallback;
    const json& v = j_.at(key);
    if (!v.is_number() || !(v.get<double>() > 0))
      MOED_THROW(Input, "{}: \"{}\" is {}, expected a positive number", path_, key, v.dump());
    return v.get<double>();
  }
  bool flag_or(const char* key, bool fallback) const {
    if (!has(key)) return fallback;
    const json& v = j_.at(key);
    if (!v.is_boolean()) MOED_THROW(Input, "{}: \"{}\" is {}, expected true or false", path_, key, v.dump());
    return v.get<bool>();
  }
  std::string text_or(const char* key, const std::string& fallback) const {
    if (!has(key)) return fallback;
    const json& v = j_.at(key);
    if (!v.is_string()) MOED_THROW(Input, "{}: \"{}\" is {}, expected a string", path_, key, v.dump());
    return v.get<std::string>();
  }
  std::vector<int> layers_or_empty(const char* key, std::int64_t layers) const {
    std::vector<int> out;
    if (!has(key)) return out;
    const json& v = j_.at(key);
    if (!v.is_array()) MOED_THROW(Input, "{}: \"{}\" is {}, expected a list of layer numbers", path_, key, v.dump());
    for (const json& e : v) out.push_back(int(checked_integer(key, e, 0, layers - 1)));
    return out;
  }
  const std::string& path() const { return path_; }
  void set_family(Family f) { family_ = name_of(f); }

 private:
  std::int64_t checked_integer(const char* key, const json& v, std::int64_t min,
                               std::int64_t max = std::int64_t(1) << 40) const {
    if (!v.is_number_integer() || v.get<std::int64_t>() < min || v.get<std::int64_t>() > max)
      MOED_THROW(Input, "{}: \"{}\" is {}, expected an integer in [{}, {}]", path_, key, v.dump(), min, max);
    return v.get<std::int64_t>();
  }

  const json& j_;
  std::string path_;
  std::string_view family_ = "moed";
};

// The name of a family's experts-per-layer key, and of its expert FFN size key.
const char* experts_key(Family f) {
  switch (f) {
    case Family::deepseek_v3: return "n_routed_experts";
    case Family::qwen3_moe:
    case Family::qwen2_moe:
    case Family::olmoe: return "num_experts";
    default: return "num_local_experts";
  }
}
const char* ffn_key(Family f) {
  switch (f) {
    case Family::deepseek_v3:
    case Family::qwen3_moe:
    case Family::qwen2_moe: return "moe_intermediate_size";
    default: return "intermediate_size";
  }
}
bool has_dense_ffn(Family f) {
  return f == Family::deepseek_v3 || f == Family::qwen3_moe || f == Family::qwen2_moe;
}

// The family's router and experts apart from the keys config.json sets.
void family_defaults(ModelSpec& s) {
  switch (s.family) {
    case Family::deepseek_v3:
      s.router.scoring = Scoring::sigmoid;
      s.router.selection_bias = true;
      s.router.scaling = 2.5;
      break;
    case Family::qwen2_moe:
      s.router.renormalize = false;
      s.shared_gated = true;
      break;
    case Family::olmoe: s.router.renormalize = false; break;
    case Family::gpt_oss:
      s.router.gate_bias = true;
      s.router.softmax_after_topk = true;
      s.router.renormalize = false;
      s.expert.activation = Activation::clamped_swiglu;
      s.expert.biases = true;
      s.expert.interleaved = true;
      break;
    default: break;
  }
}

// The expert formats moed reads, as HfConfig::expert_format and quant_method name them.
constexpr std::string_view kExpertFormats[] = {"fp8", "mxfp4"};
// The fp8 kernels take one scale per block of this many rows by as many columns.
constexpr int kFp8Block = 128;

// A JSON value for a message, arrays spaced as moed prints shapes ("[64, 64]").
std::string show(const json& v) {
  if (!v.is_array()) return v.dump();
  std::string items;
  for (const json& e : v) items += (items.empty() ? "" : ", ") + show(e);
  return "[" + items + "]";
}

// fp8 as DeepSeek-V3/R1 ship it: e4m3 weights, one scale per 128x128 block. "fmt" and
// "weight_block_size" may be left out (those are the defaults); anything else would
// decode to wrong weights without a word, so it is refused.
void check_fp8(const json& q, const std::string& path) {
  if (q.contains("fmt") && q.at("fmt") != "e4m3")
    MOED_THROW(Input, "{}: quantization_config.fmt is {}; moed reads fp8 as e4m3 (\"fmt\": \"e4m3\")", path,
               show(q.at("fmt")));
  if (q.contains("weight_block_size") && q.at("weight_block_size") != json::array({kFp8Block, kFp8Block}))
    MOED_THROW(Input, "{}: quantization_config.weight_block_size is {}; moed reads fp8 with {}x{} block scales", path,
               show(q.at("weight_block_size")), kFp8Block, kFp8Block);
}

// HfConfig::expert_format from config.json's "quantization_config" ("" without one).
std::string read_expert_format(const json& j, const std::string& path) {
  if (!j.contains("quantization_config") || j.at("quantization_config").is_null()) return "";
  const json& q = j.at("quantization_config");
  if (!q.is_object())
    MOED_THROW(Input, "{}: \"quantization_config\" is {}, expected an object with a \"quant_method\"", path, show(q));
  if (!q.contains("quant_method"))
    MOED_THROW(Input, "{}: quantization_config has no \"quant_method\", expected one of \"{}\"", path,
               fmt::join(kExpertFormats, "\", \""));
  const json& method = q.at("quant_method");
  const auto known = std::find(std::begin(kExpertFormats), std::end(kExpertFormats),
                               method.is_string() ? method.get<std::string>() : "");
  if (known == std::end(kExpertFormats))
    MOED_THROW(Input, "{}: quantization_config.quant_method is {}, which moed does not read (it reads \"{}\")", path,
               show(method), fmt::join(kExpertFormats, "\", \""));
  if (*known == "fp8") check_fp8(q, path);
  return std::string(*known);
}

// The quantization_config `format`'s checkpoints carry (read_expert_format reads it back).
json quantization_config(std::string_view format) {
  if (format == "fp8")
    return json::object({{"quant_method", "fp8"},
                         {"fmt", "e4m3"},
                         {"activation_scheme", "dynamic"},
                         {"weight_block_size", {kFp8Block, kFp8Block}}});
  MOED_CHECK(format == "mxfp4", "expert format \"{}\" is none of {}", format, fmt::join(kExpertFormats, ", "));
  return json::object({{"quant_method", "mxfp4"}});
}

}  // namespace

int ModelSpec::moe_index(int layer) const {
  auto it = std::lower_bound(moe_layers.begin(), moe_layers.end(), layer);
  return it != moe_layers.end() && *it == layer ? int(it - moe_layers.begin()) : -1;
}

std::vector<int> ModelSpec::dense_layers() const {
  std::vector<int> out;
  for (int l = 0; l < model_layers; ++l)
    if (moe_index(l) < 0) out.push_back(l);
  return out;
}

std::string ModelSpec::describe_dense() const {
  std::string dense;
  int count = 0;
  for (int l = 0; l < model_layers; ++l)
    if (moe_index(l) < 0) dense += fmt::format("{}{}", count++ ? ", " : "", l);
  if (!count) return "";
  return fmt::format("model layer{} {} {} dense", count > 1 ? "s" : "", dense, count > 1 ? "are" : "is");
}

HfConfig read_hf_config(const std::string& text, const std::string& path, const Family* family) {
  json j;
  try {
    j = json::parse(text);
  } catch (const json::exception& e) {
    MOED_THROW(Input, "{}: not valid JSON: {}", path, e.what());
  }
  if (!j.is_object()) MOED_THROW(Input, "{}: a JSON {}, expected an object of model keys", path, j.type_name());
  Keys k(j, path);
  HfConfig out;
  ModelSpec& s = out.spec;
  ModelDims& d = out.dims;
  if (family) {
    s.family = *family;
  } else {
    if (!k.has("model_type"))
      MOED_THROW(Input, "{}: no \"model_type\", so the family is unknown: set [model].family (one of {})", path,
                 fmt::join(kFamilyNames.names(), ", "));
    const std::string type = k.text_or("model_type", "");
    auto f = kFamilyNames.find(type);
    if (!f)
      MOED_THROW(Input, "{}: \"model_type\" is \"{}\", which moed does not serve (it serves {})", path, type,
                 fmt::join(kFamilyNames.names(), ", "));
    s.family = *f;
  }
  k.set_family(s.family);
  family_defaults(s);
  s.model_layers = int(k.integer("num_hidden_layers"));
  d.hidden = k.integer("hidden_size");
  d.experts = k.integer(experts_key(s.family));
  d.top_k = k.integer("num_experts_per_tok");
  d.ffn = k.integer(ffn_key(s.family));
  d.norm_eps = k.real_or("rms_norm_eps", 1e-6);
  out.torch_dtype = k.text_or("torch_dtype", "");
  out.expert_format = read_expert_format(j, path);
  if (has_dense_ffn(s.family)) s.dense_ffn = k.integer_or("intermediate_size", 0);

  std::vector<int> mlp_only;
  std::int64_t first_dense = 0, freq = 1, sparse_step = 1;
  switch (s.family) {
    case Family::deepseek_v3: {
      const std::string scoring = k.text_or("scoring_func", "sigmoid");
      if (scoring != "sigmoid" && scoring != "softmax")
        MOED_THROW(Input, "{}: \"scoring_func\" is \"{}\", expected \"sigmoid\" or \"softmax\"", path, scoring);
      s.router.scoring = scoring == "sigmoid" ? Scoring::sigmoid : Scoring::softmax;
      const std::string method = k.text_or("topk_method", "noaux_tc");
      if (method != "noaux_tc" && method != "greedy" && method != "group_limited_greedy")
        MOED_THROW(Input, "{}: \"topk_method\" is \"{}\", expected \"noaux_tc\", \"group_limited_greedy\" or \"greedy\"",
                   path, method);
      s.router.selection_bias = method == "noaux_tc";
      s.router.groups = int(k.integer_or("n_group", 1, 1));
      s.router.groups_kept = int(k.integer_or("topk_group", s.router.groups, 1));
      if (method == "greedy") s.router.groups = s.router.groups_kept = 1;
      s.router.renormalize = k.flag_or("norm_topk_prob", true);
      s.router.scaling = k.real_or("routed_scaling_factor", 1.0);
      s.shared_ffn = k.integer_or("n_shared_experts", 0) * d.ffn;
      first_dense = k.integer_or("first_k_dense_replace", 0);
      freq = k.integer_or("moe_layer_freq", 1, 1);
      break;
    }
    case Family::qwen3_moe:
    case Family::qwen2_moe:
      s.router.renormalize = k.flag_or("norm_topk_prob", false);
      mlp_only = k.layers_or_empty("mlp_only_layers", s.model_layers);
      sparse_step = k.integer_or("decoder_sparse_step", 1, 1);
      if (s.family == Family::qwen2_moe) s.shared_ffn = k.integer_or("shared_expert_intermediate_size", 0);
      break;
    case Family::olmoe: s.router.renormalize = k.flag_or("norm_topk_prob", false); break;
    case Family::gpt_oss: s.expert.limit = k.real_or("swiglu_limit", 7.0); break;
    default: break;
  }
  for (int l = 0; l < s.model_layers; ++l) {
    bool moe = true;
    if (s.family == Family::deepseek_v3) moe = l >= first_dense && l % freq == 0;
    if (s.family == Family::qwen3_moe || s.family == Family::qwen2_moe)
      moe = std::find(mlp_only.begin(), mlp_only.end(), l) == mlp_only.end() && (l + 1) % sparse_step == 0;
    if (moe) s.moe_layers.push_back(l);
  }
  if (s.moe_layers.empty()) MOED_THROW(Input, "{}: no layer of the {} is an MoE layer", path, s.model_layers);
  if (s.moe_layers.size() < std::size_t(s.model_layers) && !s.dense_ffn && has_dense_ffn(s.family))
    MOED_THROW(Input, "{}: {} but there is no \"intermediate_size\" for their FFN", path, s.describe_dense());
  d.layers = std::int64_t(s.moe_layers.size());
  check_spec(s, d, path);
  return out;
}

ModelSpec synthetic_spec(const SyntheticKeys& keys, const ModelDims& dims) {
  ModelSpec s;
  s.family = keys.family;
  family_defaults(s);
  const int dense = int(keys.dense_layers);
  if (dense && !has_dense_ffn(s.family))
    MOED_THROW(Usage, "config: [model].dense_layers = {}: {} has no dense layers (deepseek_v3, qwen3_moe and "
               "qwen2_moe do)", dense, name_of(s.family));
  s.model_layers = dense + int(dims.layers);
  for (int l = dense; l < s.model_layers; ++l) s.moe_layers.push_back(l);
  if (dense) s.dense_ffn = 4 * dims.ffn;
  if (s.family == Family::deepseek_v3) {
    // DeepSeek-V3's 8 groups, 4 kept, where the experts allow it.
    int groups = int(keys.groups);
    if (!groups) {
      groups = 1;
      for (int g : {8, 4, 2})
        if (dims.experts % g == 0 && dims.experts / g >= 2) {
          groups = g;
          break;
        }
    }
    s.router.groups = groups;
    s.router.groups_kept = int(keys.groups_kept ? keys.groups_kept : std::max(1, groups / 2));
  }
  const std::int64_t shared =
      keys.shared_experts >= 0 ? keys.shared_experts : s.family == Family::deepseek_v3 ? 1 : s.family == Family::qwen2_moe ? 4 : 0;
  if (shared && s.family != Family::deepseek_v3 && s.family != Family::qwen2_moe)
    MOED_THROW(Usage, "config: [model].shared_experts = {}: {} has no shared expert (deepseek_v3 and qwen2_moe do)",
               shared, name_of(s.family));
  s.shared_ffn = shared * dims.ffn;
  check_spec(s, dims, "config: [model]");
  return s;
}

std::string hf_config_json(const ModelSpec& s, const ModelDims& d, std::string_view torch_dtype,
                           std::string_view expert_format) {
  json j;
  j["model_type"] = std::string(name_of(s.family));
  j["num_hidden_layers"] = s.model_layers;
  j["hidden_size"] = d.hidden;
  j[experts_key(s.family)] = d.experts;
  j["num_experts_per_tok"] = d.top_k;
  j[ffn_key(s.family)] = d.ffn;
  j["rms_norm_eps"] = d.norm_eps;
  const int first_moe = s.moe_layers.empty() ? 0 : s.moe_layers.front();
  switch (s.family) {
    case Family::deepseek_v3:
      j["intermediate_size"] = s.dense_ffn ? s.dense_ffn : 4 * d.ffn;
      j["scoring_func"] = s.router.scoring == Scoring::sigmoid ? "sigmoid" : "softmax";
      j["topk_method"] = s.router.selection_bias ? "noaux_tc" : "group_limited_greedy";
      j["n_group"] = s.router.groups;
      j["topk_group"] = s.router.groups_kept;
      j["norm_topk_prob"] = s.router.renormalize;
      j["routed_scaling_factor"] = s.router.scaling;
      j["n_shared_experts"] = s.shared_ffn / d.ffn;
      j["first_k_dense_replace"] = first_moe;
      j["moe_layer_freq"] = 1;
      break;
    case Family::qwen3_moe:
    case Family::qwen2_moe: {
      j["intermediate_size"] = s.dense_ffn ? s.dense_ffn : 4 * d.ffn;
      j["norm_topk_prob"] = s.router.renormalize;
      j["decoder_sparse_step"] = 1;
      std::vector<int> mlp_only;
      for (int l = 0; l < s.model_layers; ++l)
        if (s.moe_index(l) < 0) mlp_only.push_back(l);
      j["mlp_only_layers"] = mlp_only;
      if (s.family == Family::qwen2_moe) j["shared_expert_intermediate_size"] = s.shared_ffn;
      break;
    }
    case Family::olmoe: j["norm_topk_prob"] = s.router.renormalize; break;
    case Family::gpt_oss: j["swiglu_limit"] = s.expert.limit; break;
    default: break;
  }
  j["torch_dtype"] = std::string(torch_dtype);
  if (!expert_format.empty()) j["quantization_config"] = quantization_config(expert_format);
  return j.dump(2) + "\n";
}

void check_spec(const ModelSpec& s, const ModelDims& d, const std::string& where) {
  const RouterSpec& r = s.router;
  if (d.top_k > d.experts)
    MOED_THROW(Input, "{}: top_k {} exceeds the {} experts", where, d.top_k, d.experts);
  if (r.groups < 1 || d.experts % r.groups != 0)
    MOED_THROW(Input, "{}: n_group ([model].groups) = {} does not divide the {} experts into equal groups", where, r.groups,
               d.experts);
  if (r.groups_kept < 1 || r.groups_kept > r.groups)
    MOED_THROW(Input, "{}: topk_group ([model].groups_kept) = {} is not in [1, n_group = {}]", where, r.groups_kept, r.groups);
  const std::int64_t reachable = std::int64_t(r.groups_kept) * (d.experts / r.groups);
  if (d.top_k > reachable)
    MOED_THROW(Input, "{}: top_k (num_experts_per_tok) {} exceeds the {} experts that topk_group = {} groups of {} hold", where, d.top_k,
               reachable, r.groups_kept, d.experts / r.groups);
  if (r.selection_bias && r.groups > 1 && d.experts / r.groups < 2)
    MOED_THROW(Input, "{}: groups of {} expert: a group's score is the sum of its top 2", where,
               d.experts / r.groups);
  if (s.expert.biases != (s.family == Family::gpt_oss) || r.softmax_after_topk != (s.family == Family::gpt_oss))
    MOED_THROW(Internal, "{}: {} spec with expert biases {}", where, name_of(s.family), s.expert.biases);
}

}  // namespace moed::runtime
