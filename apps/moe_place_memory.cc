#include "apps/moe_place_memory.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <iostream>
#include <optional>

#include "common/error.h"
#include "placement/memory_plan.h"
#include "placement/model_card.h"
#include "placement/model_facts.h"
#include "placement/placement.h"
#include "placement/placement_file.h"
#include "runtime/config/config.h"
#include "runtime/config/memory_estimate.h"

namespace moed::apps {

namespace {

using namespace placement;
using nlohmann::json;

std::string gib(std::uint64_t bytes) {
  if (bytes < (std::uint64_t(1) << 30)) return fmt::format("{:.1f} MiB", double(bytes) / 1048576.0);
  return fmt::format("{:.2f} GiB", double(bytes) / 1073741824.0);
}
std::string billions(std::uint64_t n) { return fmt::format("{:.2f}B", double(n) / 1e9); }

// Everything the flags, the config and the card resolve to.
struct Plan {
  runtime::Config c;
  std::optional<ModelCard> card;
  bool gpu = false;
  WeightFormat held;
  std::uint64_t overhead = 0, migration_in = 0, migration_out = 0;
  PlacementPolicy policy = PlacementPolicy::contiguous;
};

Plan resolve(const MemoryArgs& a) {
  Plan p;
  p.c = runtime::load_config(a.config, a.sets);
  if (!a.card.empty()) {
    p.card = read_model_card(a.card);
    // The expert side of the card as the daemon's [model] keys.
    runtime::ModelConfig& m = p.c.model;
    m.layers = p.card->moe_layers(), m.experts = p.card->moe.experts, m.top_k = p.card->moe.top_k;
    m.hidden = p.card->model.hidden, m.ffn = p.card->moe.expert_ffn;
    try {
      runtime::validate_config(p.c);
    } catch (const Error& e) {
      MOED_THROW(Usage, "{}: the card's shape does not fit moed's config: {}", a.card, e.what());
    }
  }
  if (a.tokens_per_step >= 0) {
    if (p.c.workload.kind == runtime::WorkloadKind::ingress)
      p.c.ingress.max_tokens_per_step = a.tokens_per_step;
    else
      p.c.workload.tokens_per_step = a.tokens_per_step;
  }
  const std::string target = a.target.empty() ? (p.card ? "gpu" : "cpu") : a.target;
  p.gpu = target == "gpu";
  // The CPU path holds experts in [experts].dtype (the checkpoint's own by default).
  const std::string dtype = !a.dtype.empty() ? a.dtype
                            : p.card          ? p.card->expert_dtype()
                            : p.gpu           ? p.c.model.dtype
                                              : runtime::experts_dtype(p.c);
  p.held = weight_format(dtype, "--dtype");
  p.overhead = a.overhead_mb >= 0 ? std::uint64_t(a.overhead_mb * 1048576.0)
                                  : p.gpu ? 0 : runtime::cpu_process_overhead_bytes();
  p.migration_in = std::uint64_t(a.migration_in), p.migration_out = std::uint64_t(a.migration_out);
  p.policy = a.policy.empty() ? p.c.placement.policy : kPlacementPolicyNames.parse(a.policy, "--policy");
  return p;
}

MemoryEstimate rank_estimate(const Plan& p, std::vector<SlotGroup> slots, int ranks, int rank) {
  RankMemoryInputs in = runtime::rank_memory_inputs(p.c, std::move(slots), ranks, rank);
  in.migration_in = p.migration_in, in.migration_out = p.migration_out;
  in.expert_format = p.held;
  if (p.gpu) {
    in.pack_at_load = false;
    in.cpu_router = false;
  }
  if (p.card) in.expert_bias = p.card->moe.expert_bias;
  in.process_bytes = p.overhead;
  in.process_what = p.gpu ? "process: CUDA context and allocator (--overhead-mb)"
                          : "process: code, MPI, UCX, OpenBLAS, allocator (measured; --overhead-mb)";
  return rank_memory(in);
}

// The estimates of every rank of a placement.
std::vector<MemoryEstimate> all_ranks(const Plan& p, const Placement& placement) {
  std::vector<MemoryEstimate> out;
  for (int r = 0; r < placement.ranks(); ++r)
    out.push_back(rank_estimate(p, slot_groups(placement, r), placement.ranks(), r));
  return out;
}

std::size_t fullest(const std::vector<MemoryEstimate>& ranks) {
  std::size_t best = 0;
  for (std::size_t r = 1; r < ranks.size(); ++r)
    if (phases(ranks[r]).peak() > phases(ranks[best]).peak()) best = r;
  return best;
}

Placement placement_for(const Plan& p, int ranks) {
  return make_placement(p.policy, ranks, int(p.c.model.layers), int(p.c.model.experts),
                        std::uint64_t(p.c.placement.seed));
}

int resolve_ranks(const MemoryArgs& a, const Plan& p, int file_ranks) {
  int ranks = a.ranks ? a.ranks : file_ranks;
  if (!ranks && a.islands && a.ranks_per_island) ranks = a.islands * a.ranks_per_island;
  if (!ranks && p.c.placement.file.empty() && !p.c.cluster.islands.empty())
    ranks = int(std::count(p.c.cluster.islands.begin(), p.c.cluster.islands.end(), ',')) + 1;
  if (file_ranks && ranks != file_ranks)
    MOED_THROW(Usage, "--ranks {} but the placement {} is for {} ranks", ranks, a.placement, file_ranks);
  if (a.islands && a.ranks_per_island && a.islands * a.ranks_per_island != ranks)
    MOED_THROW(Usage, "--islands {} x --ranks-per-island {} is not {} ranks", a.islands, a.ranks_per_island, ranks);
  if (a.islands && ranks && ranks % a.islands)
    MOED_THROW(Usage, "{} ranks do not split into {} equal islands", ranks, a.islands);
  return ranks;
}

json parts_json(const MemoryEstimate& e) {
  json parts = json::array();
  for (const MemoryPart& part : e.parts)
    parts.push_back({{"group", part.group}, {"what", part.what}, {"bytes", part.bytes}});
  return parts;
}

std::string breakdown_text(const MemoryEstimate& e) {
  std::string out;
  for (const std::string& group : memory_groups()) {
    bool any = false;
    for (const MemoryPart& part : e.parts) {
      if (part.group != group) continue;
      if (!any) out += fmt::format("  {:<24}{:>14}\n", group, gib(e.group_total(group)));
      any = true;
      out += fmt::format("    {:>14}  {}\n", gib(part.bytes), part.what);
    }
  }
  out += fmt::format("  {:<24}{:>14}  (every line at once)\n", "total", gib(e.total()));
  out += fmt::format("  {:<24}{:>14}  (the highest phase: the load, or serving while migrating)\n", "peak",
                     gib(phases(e).peak()));
  return out;
}

// Activation facts: from the card when there is one, else from the config's shape.
json activation_json(const Plan& p, std::string& text) {
  const auto& m = p.c.model;
  if (!p.card) {
    const std::uint64_t one = 3 * std::uint64_t(m.hidden) * std::uint64_t(m.ffn), L = std::uint64_t(m.layers);
    const std::uint64_t router = L * std::uint64_t(m.experts) * std::uint64_t(m.hidden);
    const std::uint64_t total = L * std::uint64_t(m.experts) * one + router, active = L * std::uint64_t(m.top_k) * one + router;
    text += fmt::format("activation (expert layers only: no model card): {} parameters, {} active per token, rate {:.3f}\n",
                        billions(total), billions(active), double(active) / double(total));
    return {{"total_params", total}, {"active_params", active}, {"activation_rate", double(active) / double(total)},
            {"counts", "expert layers and routers only"}};
  }
  const ParameterCount n = count_parameters(*p.card);
  const double rate = double(n.active) / double(n.total);
  text += fmt::format(
      "activation: {} parameters, {} active per token ({} without the input embedding), rate {:.3f}; "
      "routed experts {} of {} per layer ({:.3f})\n",
      billions(n.total), billions(n.active), billions(n.active_without_input_embedding), rate, p.card->moe.top_k,
      p.card->moe.experts, double(p.card->moe.top_k) / double(p.card->moe.experts));
  text += fmt::format("  published: {} total, {} active ({})\n", billions(std::uint64_t(p.card->published.total_params)),
                      billions(std::uint64_t(p.card->published.active_params)), p.card->published.source);
  return {{"total_params", n.total},
          {"active_params", n.active},
          {"active_params_without_input_embedding", n.active_without_input_embedding},
          {"activation_rate", rate},
          {"routed_experts", n.routed_experts},
          {"published_total_params", p.card->published.total_params},
          {"published_active_params", p.card->published.active_params}};
}

// The attention side of a disaggregated deployment: its weights and KV cache.
json attention_json(const Plan& p, const MemoryArgs& a, std::string& text) {
  const ModelCard& card = *p.card;
  const ParameterCount n = count_parameters(card);
  const WeightFormat f = weight_format(card.model.dtype, "[model].dtype");
  const std::uint64_t weights = f.bytes(n.total - n.routed_experts - n.routers);
  const KvCache kv = kv_cache(card, 2);
  const std::uint64_t per_sequence = kv.at_context(a.context, card);
  const std::string formula =
      card.attention.kind == "gqa"
          ? fmt::format("2 x {} layers x {} KV heads x head dim {} x 2 bytes", card.model.layers,
                        card.attention.kv_heads, card.attention.head_dim)
          : fmt::format("(kv_lora_rank {} + qk_rope_head_dim {}) x {} layers x 2 bytes", card.attention.kv_lora_rank,
                        card.attention.qk_rope_head_dim, card.model.layers);
  text += fmt::format("attention side ({}):\n", card.attention.kind == "gqa" ? "GQA" : "MLA");
  text += fmt::format("  weights: attention, embeddings, norms{}{} in {}: {} ({} parameters)\n",
                      n.dense_ffn ? ", dense FFNs" : "", n.shared_experts ? ", shared experts" : "", f.name,
                      gib(weights), billions(n.total - n.routed_experts - n.routers));
  text += fmt::format("  KV cache per token: {} bytes = {}{}\n", kv.per_token, formula,
                      card.attention.sliding_layers
                          ? fmt::format(" ({} layers hold at most {} tokens)", card.attention.sliding_layers,
                                        card.attention.sliding_window)
                          : "");
  text += fmt::format("  KV cache at context {}: {} per sequence, {} for {} sequence{}\n", a.context,
                      gib(per_sequence), gib(per_sequence * a.sequences), a.sequences, a.sequences == 1 ? "" : "s");
  return {{"weights_bytes", weights},
          {"kv_bytes_per_token", kv.per_token},
          {"context", a.context},
          {"kv_bytes_per_sequence", per_sequence},
          {"sequences", a.sequences},
          {"kv_bytes", per_sequence * a.sequences}};
}

}  // namespace

int memory_cmd(const MemoryArgs& a) {
  Plan p = resolve(a);
  const std::uint64_t budget = a.gpu_memory.empty() ? 0 : parse_memory_size(a.gpu_memory, "--gpu-memory");
  if (a.fewest_gpus && !budget) MOED_THROW(Usage, "--fewest-gpus needs --gpu-memory, the memory of one GPU");
  const std::string placement_path = !a.placement.empty() ? a.placement : p.c.placement.file;
  if (a.fewest_gpus && !placement_path.empty())
    MOED_THROW(Usage, "--fewest-gpus chooses the rank count: it takes a --policy, not the placement {}",
               placement_path);
  std::optional<Placement> file;
  if (!placement_path.empty() && !a.fewest_gpus) {
    file = read_placement_file(placement_path);
    check_placement_shape(*file, file->ranks(), int(p.c.model.layers), int(p.c.model.experts), placement_path);
  }
  const int ranks = resolve_ranks(a, p, file ? file->ranks() : 0);
  if (!ranks && !a.fewest_gpus)
    MOED_THROW(Usage, "how many ranks? give --ranks, a --placement, or --fewest-gpus with --gpu-memory");

  std::string text;
  json out = {{"target", p.gpu ? "gpu" : "cpu"}, {"expert_format", p.held.name},
              {"model", p.card ? p.card->model.name : "[model] of the config"},
              {"tokens_key", runtime::rank_memory_inputs(p.c, 0, 1, 0).tokens_key}};
  text += fmt::format("{}: {} MoE layers x {} experts (top-{}), hidden {}, expert FFN {}; {} target, experts in {}\n",
                      p.card ? p.card->model.name : "config", p.c.model.layers, p.c.model.experts, p.c.model.top_k,
                      p.c.model.hidden, p.c.model.ffn, p.gpu ? "GPU" : "CPU (moed today)", p.held.name);

  if (a.fewest_gpus) {
    // Whole experts: beyond one expert per rank per layer, more ranks hold no less.
    const int step = a.ranks_per_island ? a.ranks_per_island : 1;
    const int most = int(p.c.model.experts) + step - 1;
    std::optional<int> found;
    MemoryEstimate largest;
    for (int r = step; r <= most && !found; r += step) {
      std::vector<MemoryEstimate> each = all_ranks(p, placement_for(p, r));
      largest = each[fullest(each)];
      if (phases(largest).peak() <= budget) found = r;
    }
    if (!found) {
      text += fmt::format("fewest GPUs of {}: none: even one expert per rank per layer needs {} (tensor-sharded "
                          "experts would be needed)\n",
                          gib(budget), gib(phases(largest).peak()));
      out["fewest_gpus"] = nullptr;
    } else {
      text += fmt::format("fewest GPUs of {} that hold it at {} = {}: {} ({} policy; its fullest rank {})\n",
                          gib(budget), out["tokens_key"].get<std::string>(),
                          p.c.workload.kind == runtime::WorkloadKind::ingress ? p.c.ingress.max_tokens_per_step : p.c.workload.tokens_per_step,
                          *found, name_of(p.policy), gib(phases(largest).peak()));
      out["fewest_gpus"] = *found;
    }
    out["fewest_gpus_largest_rank_bytes"] = phases(largest).peak();
  }

  const int shown_ranks = ranks ? ranks : out["fewest_gpus"].is_null() ? 0 : out["fewest_gpus"].get<int>();
  if (shown_ranks) {
    const Placement placement = file ? *file : placement_for(p, shown_ranks);
    const std::vector<MemoryEstimate> each = all_ranks(p, placement);
    const std::size_t big = fullest(each);
    text += fmt::format("{} ranks{}; the fullest, rank {} ({} slots):\n", shown_ranks,
                        a.islands ? fmt::format(" in {} islands", a.islands) : "", big, placement.slots_on(int(big)));
    text += breakdown_text(each[big]);
    json per_rank = json::array();
    text += fmt::format("  {:>9}  {:>5}  {:>12}  {:>12}  {:>12}  {:>12}\n", "rank", "slots", "after load", "load peak",
                        "serving", "migrating");
    for (std::size_t r = 0; r < each.size(); ++r) {
      const MemoryPhases ph = phases(each[r]);
      per_rank.push_back({{"rank", r}, {"slots", placement.slots_on(int(r))}, {"after_load_bytes", ph.after_load},
                          {"load_peak_bytes", ph.load_peak}, {"serving_bytes", ph.serving},
                          {"migrating_bytes", ph.migrating}, {"peak_bytes", ph.peak()}});
      text += fmt::format("  rank {:>4}  {:>5}  {:>12}  {:>12}  {:>12}  {:>12}{}\n", r, placement.slots_on(int(r)),
                          gib(ph.after_load), gib(ph.load_peak), gib(ph.serving), gib(ph.migrating),
                          budget && ph.peak() > budget ? "  OVER BUDGET" : "");
    }
    const std::uint64_t peak = phases(each[big]).peak();
    if (budget)
      text += fmt::format("budget: {} per GPU: {}\n", gib(budget),
                          peak <= budget ? fmt::format("fits ({:.0f}% at the fullest rank's peak)",
                                                       100.0 * double(peak) / double(budget))
                                         : fmt::format("does NOT fit: the fullest rank's peak is {} over",
                                                       gib(peak - budget)));
    out["ranks"] = shown_ranks;
    out["fullest_rank"] = big;
    out["fullest_rank_parts"] = parts_json(each[big]);
    out["per_rank"] = per_rank;
    if (budget) out["fits"] = phases(each[big]).peak() <= budget;
  }
  if (budget) out["gpu_memory_bytes"] = budget;
  out["activation"] = activation_json(p, text);
  if (p.card) out["attention"] = attention_json(p, a, text);
  if (a.json)
    std::cout << out.dump(2) << "\n";
  else
    std::cout << text;
  return 0;
}

}  // namespace moed::apps
