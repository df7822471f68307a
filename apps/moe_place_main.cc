// moe-place: placements of experts onto ranks, offline; the daemon runs the
// same code online. Subcommands: optimize, evaluate, diff, stats, make,
// check, convert-trace, memory. Exit codes: 0 ok, 2 bad usage or input.
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <iostream>
#include <optional>

#include "apps/moe_place_memory.h"
#include "common/error.h"
#include "placement/cost_model.h"
#include "placement/optimizer.h"
#include "placement/placement.h"
#include "placement/placement_diff.h"
#include "placement/placement_file.h"
#include "placement/redundancy.h"
#include "placement/shard_choice.h"
#include "placement/shard_rules.h"
#include "placement/topology.h"
#include "placement/weight_format.h"
#include "routing/routing_stats.h"
#include "routing/routing_trace.h"
#include "routing/stats_file.h"
#include "runtime/config/config.h"

namespace {

using namespace moed::placement;
using namespace moed::routing;
using nlohmann::json;

// What moe-place takes from a moed config: the model's shape, the islands,
// and the bytes of one expert (to price moves).
struct ModelInfo {
  int layers = 0, experts = 0, ranks_per_island = 0, ffn_chunks = 1;
  int expert_groups = 1;  // the router's groups (DeepSeek's n_group); 1: none
  std::uint64_t expert_bytes = 0;
  double cost_same_island = 1, cost_cross_island = 8;
  moed::LayerNumbers numbers;  // the model layer numbers of its MoE layers (placement files name them)
};

ModelInfo load_model_info(const std::string& path) {
  moed::runtime::Config c = moed::runtime::load_config(path, {});
  // What a move costs is what migration sends: the daemon holds and moves
  // experts in [experts].dtype (the checkpoint's own by default).
  const moed::placement::WeightFormat held =
      moed::placement::weight_format(moed::runtime::experts_dtype(c), "[experts].dtype");
  return {int(c.model.layers), int(c.model.experts), int(c.cluster.ranks_per_island), int(c.experts.ffn_chunks),
          moed::runtime::model_spec(c.model).router.groups,
          held.bytes(std::uint64_t(3) * std::uint64_t(c.model.hidden) * std::uint64_t(c.model.ffn)),
          c.cluster.cost_same_island, c.cluster.cost_cross_island, moed::runtime::layer_numbers(c.model)};
}

void check_model_shape(const ModelInfo& m, int layers, int experts, const std::string& origin) {
  if (m.layers != layers || m.experts != experts)
    MOED_THROW(Input, "{} has {} layers x {} experts; the config says {} x {}", origin, layers,
               experts, m.layers, m.experts);
}

// How ranks group into islands: --ranks, --islands, --ranks-per-island (any
// two, or one with the rank count known from a placement), else the config.
struct TopologyFlags {
  int ranks = 0, islands = 0, ranks_per_island = 0;
};

Topology resolve_topology(const TopologyFlags& f, int known_ranks, const std::optional<ModelInfo>& model) {
  int ranks = f.ranks ? f.ranks : known_ranks;
  int per_island = f.ranks_per_island;
  if (!per_island && f.islands && ranks) {
    if (ranks % f.islands) MOED_THROW(Usage, "{} ranks do not split into {} equal islands", ranks, f.islands);
    per_island = ranks / f.islands;
  }
  if (!per_island && model && model->ranks_per_island > 0) per_island = model->ranks_per_island;
  if (!ranks && f.islands && per_island) ranks = f.islands * per_island;
  if (!ranks)
    MOED_THROW(Usage, "how many ranks? give --ranks, or --islands with --ranks-per-island");
  if (!per_island)
    MOED_THROW(Usage,
               "how do ranks group into islands? give --islands or --ranks-per-island (or a config "
               "with [cluster].ranks_per_island)");
  if (f.islands && f.islands * per_island != ranks)
    MOED_THROW(Usage, "--islands {} x --ranks-per-island {} is not {} ranks", f.islands, per_island, ranks);
  Topology t = Topology::blocks(ranks, per_island);
  if (model) t.set_link_costs(model->cost_same_island, model->cost_cross_island);
  return t;
}

// A token range "A:B" (B exclusive; empty ends mean the trace's ends).
std::pair<std::size_t, std::size_t> token_range(const std::string& text, std::size_t tokens,
                                                const std::string& flag) {
  if (text.empty()) return {0, tokens};
  auto colon = text.find(':');
  try {
    if (colon == std::string::npos) throw std::invalid_argument("no colon");
    std::size_t a = colon ? std::stoull(text.substr(0, colon)) : 0;
    std::size_t b = colon + 1 < text.size() ? std::stoull(text.substr(colon + 1)) : tokens;
    if (a >= b || b > tokens) throw std::out_of_range("range");
    return {a, b - a};
  } catch (const std::exception&) {
    MOED_THROW(Usage, "{} {}: expected FIRST:END token indices within the trace's {} tokens", flag,
               text, tokens);
  }
}

json cost_json(const Cost& c) {
  return {{"cross_island_copies_per_token", c.cross_island_copies_per_token},
          {"same_island_copies_per_token", c.same_island_copies_per_token},
          {"max_mean_rank_load", c.max_mean_rank_load},
          {"max_mean_island_load", c.max_mean_island_load},
          {"link_cost_per_token", c.link_cost_per_token},
          {"token_layers", c.token_layers},
          {"token_layers_by_islands", c.token_layers_by_islands}};
}

// How metis chose its pooled share: the trade-off it measured, share by share.
json pooling_json(const PoolingChoice& c) {
  json front = json::array();
  for (const PoolingTrial& t : c.front)
    front.push_back({{"share", t.share},
                     {"cross_island_copies_per_token", t.cross_island_copies_per_token},
                     {"max_mean_rank_load", t.max_mean_rank_load},
                     {"within_cap", t.within_cap}});
  return {{"share", c.share},
          {"load_only", c.load_only},
          {"load_cap", c.load_cap},
          {"balanced_load", c.balanced_load},
          {"balanced_copies", c.balanced_copies},
          {"tokens_judged", c.tokens},
          {"layers_judged", c.layers},
          {"front", front}};
}

std::string cost_text(const Cost& c) {
  return fmt::format(
      "  cross-island copies per token   {:.4f}\n"
      "  same-island copies per token    {:.4f}\n"
      "  max/mean rank load              {:.3f}\n"
      "  max/mean island load            {:.3f}\n"
      "  link cost per token             {:.4f}\n",
      c.cross_island_copies_per_token, c.same_island_copies_per_token, c.max_mean_rank_load,
      c.max_mean_island_load, c.link_cost_per_token);
}

struct OptimizeArgs {
  std::string config, stats, trace, tokens, out, from;
  OptimizeOptions options;
  ShardRule shard_rule;
  int redundancy = 1;
  int max_moves = -1;
  bool json = false;
};

int optimize_cmd(const OptimizeArgs& a, const TopologyFlags& tf) {
  if (a.stats.empty() == a.trace.empty())
    MOED_THROW(Usage, "optimize takes one of --stats FILE or --trace FILE");
  std::optional<ModelInfo> model;
  if (!a.config.empty()) model = load_model_info(a.config);
  std::optional<RoutingTrace> trace;
  RoutingStats stats = [&] {
    if (!a.stats.empty()) return read_stats_file(a.stats);
    trace = read_trace(a.trace);
    auto [first, count] = token_range(a.tokens, trace->tokens(), "--tokens");
    return RoutingStats::from_trace(*trace, first, count);
  }();
  if (model) check_model_shape(*model, stats.layers(), stats.experts(), a.stats.empty() ? a.trace : a.stats);
  std::optional<Placement> current;
  const moed::LayerNumbers numbers = model ? model->numbers : moed::LayerNumbers();
  if (!a.from.empty()) current = read_placement_file(a.from, numbers);
  Topology topology = resolve_topology(tf, current ? current->ranks() : 0, model);
  if (current) check_placement_shape(*current, topology.ranks(), stats.layers(), stats.experts(), a.from);

  OptimizeOptions options = a.options;
  if (options.expert_groups == 0 && model && model->expert_groups > 1) options.expert_groups = model->expert_groups;
  Optimized optimized = optimize_explained(stats, topology, options);
  Placement next = std::move(optimized.placement);
  ShardRule rule = a.shard_rule;
  rule.slots_per_rank = a.options.slots_per_rank;  // the memory budget, per layer
  next = split_hot_experts(next, stats, topology, rule);
  RoutingTrace sample = stats.sample_trace();
  std::optional<MoveCost> moved;
  if (current) {
    next = relabel_to_minimise_moves(*current, next, topology);
    next = keep_splits(*current, std::move(next));  // a migration does not re-split an expert
  }
  next = add_island_redundancy(next, stats, topology, a.redundancy);
  if (current) {
    if (a.max_moves >= 0) next = limit_moves(*current, next, a.max_moves, sample, topology);
    next.set_epoch(current->epoch() + 1);
    moved = move_cost(*current, next, model ? model->expert_bytes : 0);
  } else if (a.max_moves >= 0) {
    MOED_THROW(Usage, "--max-moves needs --from, the placement to move from");
  }
  write_placement_file(next, a.out, numbers);

  Cost cost = evaluate(sample, next, topology);
  if (a.json) {
    json out = {{"placement", a.out}, {"policy", std::string(name_of(a.options.policy))}, {"ranks", topology.ranks()},
                {"islands", topology.islands()}, {"epoch", next.epoch()},
                {"cost_on_input", cost_json(cost)}};
    if (optimized.pooling) out["pooling"] = pooling_json(*optimized.pooling);
    if (current) {
      out["cost_of_current_on_input"] = cost_json(evaluate(sample, *current, topology));
      out["moved_slots"] = moved->slots;
      out["moved_bytes"] = moved->bytes;
    }
    std::cout << out.dump(2) << "\n";
    return 0;
  }
  std::cout << fmt::format("wrote {}: {} placement, epoch {}, {} ranks in {}\n", a.out, name_of(a.options.policy),
                           next.epoch(), topology.ranks(), topology.describe());
  if (optimized.pooling) std::cout << optimized.pooling->describe() << "\n";
  std::cout << "on the input routing (" << sample.tokens() << " tokens):\n" << cost_text(cost);
  if (current) {
    std::cout << "the current placement on the same routing:\n"
              << cost_text(evaluate(sample, *current, topology));
    std::cout << fmt::format("moves: {} slots{}\n", moved->slots,
                             moved->bytes ? fmt::format(", {:.1f} MB", double(moved->bytes) / 1e6) : "");
  }
  return 0;
}

int evaluate_cmd(const std::string& config, const std::string& trace_path, const std::string& tokens,
                 const std::string& placement_path, const TopologyFlags& tf, bool as_json) {
  std::optional<ModelInfo> model;
  if (!config.empty()) model = load_model_info(config);
  RoutingTrace trace = read_trace(trace_path);
  Placement p = read_placement_file(placement_path);
  Topology topology = resolve_topology(tf, p.ranks(), model);
  if (p.ranks() != topology.ranks())
    MOED_THROW(Usage, "{} is for {} ranks, the topology has {}", placement_path, p.ranks(), topology.ranks());
  if (p.layers() < trace.layers() || p.experts() < trace.experts())
    MOED_THROW(Input, "{} covers {} layers x {} experts; the trace {} has {} x {}", placement_path,
               p.layers(), p.experts(), trace_path, trace.layers(), trace.experts());
  auto [first, count] = token_range(tokens, trace.tokens(), "--tokens");
  Cost cost = evaluate(trace, first, count, p, topology);
  if (as_json) {
    json out = cost_json(cost);
    out["placement"] = placement_path;
    out["trace"] = trace_path;
    out["tokens"] = count;
    out["ranks"] = topology.ranks();
    out["islands"] = topology.islands();
    std::cout << out.dump(2) << "\n";
  } else {
    std::cout << fmt::format("{} on {} ({} tokens, {}):\n", placement_path, trace_path, count,
                             topology.describe())
              << cost_text(cost);
  }
  return 0;
}

int diff_cmd(const std::string& old_path, const std::string& new_path, bool as_json) {
  Placement a = read_placement_file(old_path), b = read_placement_file(new_path);
  if (a.ranks() != b.ranks() || a.layers() != b.layers() || a.experts() != b.experts())
    MOED_THROW(Input, "{} ({} ranks, {} x {}) and {} ({} ranks, {} x {}) differ in shape", old_path,
               a.ranks(), a.layers(), a.experts(), new_path, b.ranks(), b.layers(), b.experts());
  std::vector<Move> ms = moves(a, b);
  if (as_json) {
    json list = json::array();
    for (const Move& m : ms) {
      json move = {{"layer", m.layer}, {"expert", m.expert}, {"from", m.from}, {"to", m.to}, {"drop", m.drop}};
      if (m.shards > 1) move.update({{"shard", m.shard}, {"shards", m.shards}, {"cut", m.cut}, {"copy", m.copy}});
      list.push_back(std::move(move));
    }
    std::cout << json{{"old", old_path}, {"new", new_path}, {"moves", list}}.dump(2) << "\n";
  } else {
    std::cout << fmt::format("{} -> {}: {} move{}\n", old_path, new_path, ms.size(), ms.size() == 1 ? "" : "s")
              << describe_moves(ms);
  }
  return 0;
}

// A stats file's summary: shape, age, the hottest experts and the most
// co-activated pairs per layer; --full adds every aggregate (for scripts).
int stats_cmd(const std::string& path, bool as_json, bool full) {
  RoutingStats s = read_stats_file(path);
  json layers = json::array();
  std::string text = fmt::format("{}: {} layers x {} experts, {} steps, half-life {} steps, {} sampled tokens\n",
                                 path, s.layers(), s.experts(), s.steps(), s.half_life_steps(), s.sample_size());
  for (int l = 0; l < s.layers(); ++l) {
    std::vector<double> loads(s.experts());
    int hot = 0;
    double total = 0;
    for (int e = 0; e < s.experts(); ++e) {
      loads[e] = s.load(l, e);
      total += loads[e];
      if (loads[e] > loads[hot]) hot = e;
    }
    int pa = 0, pb = s.experts() > 1 ? 1 : 0;
    for (int a = 0; a < s.experts(); ++a)
      for (int b = a + 1; b < s.experts(); ++b)
        if (s.coactivation(l, a, b) > s.coactivation(l, pa, pb)) pa = a, pb = b;
    double mean = total / s.experts();
    json layer = {{"layer", l}, {"tokens", s.tokens(l)}, {"hottest_expert", hot},
                  {"hottest_over_mean", mean > 0 ? loads[hot] / mean : 0},
                  {"top_pair", {pa, pb}}, {"top_pair_coactivation", s.coactivation(l, pa, pb)}};
    if (full) {
      layer["loads"] = loads;
      json co = json::array();
      for (int a = 0; a < s.experts(); ++a)
        for (int b = a + 1; b < s.experts(); ++b) co.push_back(s.coactivation(l, a, b));
      layer["coactivation"] = co;
    }
    layers.push_back(layer);
    text += fmt::format("  layer {:3}: {:.0f} tokens, hottest expert {} at {:.2f}x the mean, top pair {}+{} "
                        "({:.0f})\n",
                        l, s.tokens(l), hot, mean > 0 ? loads[hot] / mean : 0, pa, pb, s.coactivation(l, pa, pb));
  }
  if (as_json)
    std::cout << json{{"file", path}, {"layers", s.layers()}, {"experts", s.experts()}, {"steps", s.steps()},
                      {"half_life_steps", s.half_life_steps()}, {"sample_tokens", s.sample_size()},
                      {"per_layer", layers}}.dump(2)
              << "\n";
  else
    std::cout << text;
  return 0;
}

int make_cmd(const std::string& policy, int ranks, int layers, int experts, std::uint64_t seed,
             int replicas, const std::string& out) {
  Placement p = make_placement(kPlacementPolicyNames.parse(policy, "--policy"), ranks, layers, experts, seed);
  if (replicas > 0) p = add_random_replicas(std::move(p), replicas, seed);
  p.validate("moe-place make");
  write_placement_file(p, out);
  std::cout << fmt::format("wrote {}: {} placement of {} layers x {} experts on {} ranks{}\n", out,
                           policy, layers, experts, ranks,
                           replicas ? fmt::format(", {} extra replicas per layer", replicas) : "");
  return 0;
}

struct CheckArgs {
  std::string path, config;
  int max_slots = 0, ffn_chunks = 0;
};

// A placement's own validity; with split experts also the run's shard rules
// (check_shards: S divides [experts].ffn_chunks, the shards on one island),
// which need the run's F-chunks and islands: from --config, or the flags.
int check_cmd(const CheckArgs& a, const TopologyFlags& tf) {
  std::optional<ModelInfo> model;
  if (!a.config.empty()) model = load_model_info(a.config);
  Placement p = read_placement_file(a.path, model ? model->numbers : moed::LayerNumbers());
  if (model) check_placement_shape(p, p.ranks(), model->layers, model->experts, a.path);
  p.validate(a.path, a.max_slots);
  std::string shards;
  if (p.any_sharded()) {
    const int chunks = a.ffn_chunks ? a.ffn_chunks : model ? model->ffn_chunks : 0;
    if (!chunks)
      MOED_THROW(Usage, "{} splits experts: give --config (or --ffn-chunks N and the islands) to check the shard rules",
                 a.path);
    check_shards(p, chunks, resolve_topology(tf, p.ranks(), model), a.path);
    int split = 0;
    for (int l = 0; l < p.layers(); ++l)
      for (int e = 0; e < p.experts(); ++e) split += p.sharded(l, e);
    shards = fmt::format(", {} split expert{} within the shard rules ({} F-chunks)", split, split == 1 ? "" : "s",
                         chunks);
  }
  std::cout << fmt::format("{}: valid: epoch {}, {} ranks, {} layers x {} experts, at most {} "
                           "slots per rank{}\n",
                           a.path, p.epoch(), p.ranks(), p.layers(), p.experts(), p.max_slots_per_rank(), shards);
  return 0;
}

int convert_trace_cmd(const std::string& from, const std::string& out) {
  RoutingTrace trace = read_trace(from);
  write_trace_file(trace, out);
  std::cout << fmt::format("wrote {}: {} tokens, {} layers, {} experts, top-{}\n", out, trace.tokens(),
                           trace.layers(), trace.experts(), trace.top_k());
  return 0;
}

void add_topology_flags(CLI::App* cmd, TopologyFlags& tf) {
  cmd->add_option("--ranks", tf.ranks, "ranks in all")->check(CLI::PositiveNumber);
  cmd->add_option("--islands", tf.islands, "islands (nodes)")->check(CLI::PositiveNumber);
  cmd->add_option("--ranks-per-island", tf.ranks_per_island, "ranks per island")->check(CLI::PositiveNumber);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"moe-place: expert placements for moed (exit codes: 0 ok, 2 bad usage or input)"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "moe-place 0.1.0");
  TopologyFlags tf;
  bool as_json = false;

  OptimizeArgs opt;
  auto* optimize_app = app.add_subcommand("optimize", "place experts from routing statistics or a trace");
  optimize_app->add_option("-c,--config", opt.config, "moed config (model shape, islands, expert size)")->type_name("FILE");
  optimize_app->add_option("--stats", opt.stats, "stats file written by moed")->type_name("FILE");
  optimize_app->add_option("--trace", opt.trace, "routing trace (moed-trace v1 or JSON lines)")->type_name("FILE");
  optimize_app->add_option("--tokens", opt.tokens, "with --trace: the tokens to fit on, FIRST:END")->type_name("A:B");
  optimize_app->add_option("--out", opt.out, "placement file to write")->required()->type_name("FILE");
  optimize_app
      ->add_option_function<std::string>(
          "--policy",
          [&opt](const std::string& name) { opt.options.policy = kOptimizerPolicyNames.parse(name, "--policy"); },
          "metis, greedy-load, contiguous or round-robin")
      ->check(CLI::IsMember(kOptimizerPolicyNames.names()));
  optimize_app->add_option("--from", opt.from, "current placement: relabel to move the fewest bytes")->type_name("FILE");
  optimize_app->add_option("--max-moves", opt.max_moves, "with --from: at most N slot moves, best gain per byte first")
      ->check(CLI::NonNegativeNumber);
  auto* slots_flag =
      optimize_app->add_option("--slots-per-rank", opt.options.slots_per_rank,
                               "the slot budget: slots per rank in each layer, every one spent")
          ->check(CLI::PositiveNumber);
  optimize_app->add_option("--redundant-slots", opt.options.redundant_slots,
                           "the slot budget: slots per layer beyond one per expert (default: hot experts' "
                           "replicas plus one per island)")
      ->check(CLI::NonNegativeNumber)
      ->excludes(slots_flag);
  optimize_app->add_flag("--affinity", opt.options.affinity, "metis: keep a token's consecutive experts on one island");
  optimize_app->add_flag("!--no-replicas", opt.options.replicate, "never replicate hot experts");
  optimize_app->add_option("--shard-over-mean", opt.shard_rule.over_mean,
                           "split experts whose load exceeds X times their layer's mean into shards on one "
                           "island instead of replicating them (0: never; see docs/placement.md)")
      ->check(CLI::NonNegativeNumber)
      ->type_name("X");
  optimize_app->add_option("--shards", opt.shard_rule.shards,
                           "shards per split expert (must divide the run's [experts].ffn_chunks; default 2)")
      ->check(CLI::Range(2, 1 << 16));
  optimize_app->add_option("--redundancy", opt.redundancy,
                           "every expert on at least N islands (a replica added on each missing one, after any "
                           "split): a lost rank or host then leaves each expert a copy (default 1)")
      ->check(CLI::Range(1, 1 << 16))
      ->type_name("N");
  optimize_app->add_flag("--shard-per-island", opt.shard_rule.per_island,
                         "a split replicated expert keeps a copy of its shards on each island of its replicas "
                         "(default: one copy, on the island holding most)");
  optimize_app->add_option("--seed", opt.options.seed, "METIS seed");
  optimize_app->add_option("--load-cap", opt.options.load_cap,
                           "metis: max/mean rank load at most the load-only baseline's + this, then fewest "
                           "cross-island copies (default 0.05)")
      ->check(CLI::Range(0.0, 1e6));
  optimize_app->add_option("--pooled-share", opt.options.pooled_share,
                           "metis: the share of replicated experts whose replicas may share an island "
                           "(default: chosen on the input by cross-validation against --load-cap)")
      ->check(CLI::Range(0.0, 1.0));
  optimize_app->add_option("--island-tolerance", opt.options.island_tolerance,
                           "metis: how far above the mean an island's load per rank may stay (default 0.02)")
      ->check(CLI::Range(0.0, 1.0));
  optimize_app->add_option("--groups", opt.options.expert_groups,
                           "metis: the router's expert groups, consecutive ids (DeepSeek's n_group; default: "
                           "the config's router, else none)")
      ->check(CLI::PositiveNumber);
  optimize_app->add_option("--group-hint", opt.options.group_hint,
                           "metis: co-activation inside a group weighs 1 + X times in the cut (default 0: "
                           "groups ignored; see docs/placement.md)")
      ->check(CLI::Range(0.0, 1e6))
      ->type_name("X");
  optimize_app->add_flag("--json", opt.json, "JSON output");
  add_topology_flags(optimize_app, tf);

  std::string config, trace, tokens, placement_path;
  auto* evaluate_app = app.add_subcommand("evaluate", "the cost model of a placement on a trace");
  evaluate_app->add_option("-c,--config", config, "moed config (islands)")->type_name("FILE");
  evaluate_app->add_option("--trace", trace, "routing trace")->required()->type_name("FILE");
  evaluate_app->add_option("--tokens", tokens, "the tokens to evaluate on, FIRST:END")->type_name("A:B");
  evaluate_app->add_option("--placement", placement_path, "placement file")->required()->type_name("FILE");
  evaluate_app->add_flag("--json", as_json, "JSON output");
  add_topology_flags(evaluate_app, tf);

  std::string old_path, new_path;
  auto* diff_app = app.add_subcommand("diff", "the slot moves from one placement to another");
  diff_app->add_option("old", old_path, "current placement")->required();
  diff_app->add_option("new", new_path, "next placement")->required();
  diff_app->add_flag("--json", as_json, "JSON output");

  std::string stats_path;
  bool full = false;
  auto* stats_app = app.add_subcommand("stats", "summarise a stats file written by moed");
  stats_app->add_option("file", stats_path, "stats file")->required();
  stats_app->add_flag("--json", as_json, "JSON output");
  stats_app->add_flag("--full", full, "with --json: every load and co-activation count");

  std::string policy = "contiguous", out, path, from;
  int ranks = 0, layers = 0, experts = 0, replicas = 0;
  std::uint64_t seed = 1;
  auto* make_app = app.add_subcommand("make", "write a placement file built by a simple policy");
  make_app->add_option("--policy", policy, "contiguous, round-robin or shuffled")
      ->check(CLI::IsMember(kPlacementPolicyNames.names()));
  make_app->add_option("--ranks", ranks, "ranks")->required()->check(CLI::PositiveNumber);
  make_app->add_option("--layers", layers, "MoE layers")->required()->check(CLI::PositiveNumber);
  make_app->add_option("--experts", experts, "experts per layer")->required()->check(CLI::PositiveNumber);
  make_app->add_option("--seed", seed, "seed of the shuffled policy and of replicas");
  make_app->add_option("--replicas", replicas, "extra replicas per layer, on seeded random experts")
      ->check(CLI::NonNegativeNumber);
  make_app->add_option("--out", out, "placement file to write")->required();

  auto* check_app = app.add_subcommand("check", "validate a placement file (and its split experts against the run)");
  CheckArgs check;
  TopologyFlags check_tf;
  check_app->add_option("placement", check.path, "placement file")->required();
  check_app->add_option("--max-slots-per-rank", check.max_slots, "slot capacity per rank (0: unlimited)");
  check_app->add_option("-c,--config", check.config, "moed config (shape, [experts].ffn_chunks, islands)")
      ->type_name("FILE");
  check_app->add_option("--ffn-chunks", check.ffn_chunks, "the run's [experts].ffn_chunks (split experts)")
      ->check(CLI::PositiveNumber);
  add_topology_flags(check_app, check_tf);

  auto* convert_app = app.add_subcommand(
      "convert-trace", "convert routing JSON lines (or a moed trace) into the moed-trace v1 format");
  convert_app->add_option("input", from, "JSONL (one object per layer and token) or moed-trace file")->required();
  convert_app->add_option("--out", out, "trace file to write")->required();

  moed::apps::MemoryArgs mem;
  auto* memory_app = app.add_subcommand(
      "memory", "what each rank holds (experts, router, buffers, migration, statistics) against a GPU's memory");
  memory_app->add_option("-c,--config", mem.config, "moed config (shape, tokens, placement, statistics)")->type_name("FILE");
  memory_app->add_option("--set", mem.sets, "override a config key, section.key=value (repeatable)");
  memory_app->add_option("--card", mem.card, "model card (configs/models/): the model's shape and attention")
      ->type_name("FILE");
  memory_app->add_option("--target", mem.target, "cpu (moed's CPU path: experts in [experts].dtype) or gpu (default: gpu with --card)")
      ->check(CLI::IsMember({"cpu", "gpu"}));
  memory_app->add_option("--dtype", mem.dtype, "the experts' format (default: the card's; cpu: [experts].dtype; gpu: [model].dtype)")
      ->check(CLI::IsMember(moed::placement::weight_format_names()));
  memory_app->add_option("--placement", mem.placement, "placement file (default: [placement].file)")->type_name("FILE");
  memory_app->add_option("--policy", mem.policy, "without a placement file: contiguous, round-robin or shuffled")
      ->check(CLI::IsMember(kPlacementPolicyNames.names()));
  memory_app->add_option("--ranks", mem.ranks, "ranks (GPUs) in all")->check(CLI::PositiveNumber);
  memory_app->add_option("--islands", mem.islands, "islands (nodes)")->check(CLI::PositiveNumber);
  memory_app->add_option("--ranks-per-island", mem.ranks_per_island, "ranks per island")->check(CLI::PositiveNumber);
  memory_app->add_option("--tokens-per-step", mem.tokens_per_step,
                         "tokens per step (the job's; with the front door, per rank)")
      ->check(CLI::NonNegativeNumber);
  memory_app->add_option("--gpu-memory", mem.gpu_memory, "memory of one GPU: 80 or 80GiB, 141GB, 512MiB")
      ->type_name("SIZE");
  memory_app->add_flag("--fewest-gpus", mem.fewest_gpus, "the fewest GPUs of --gpu-memory that hold the model");
  memory_app->add_option("--migration-in", mem.migration_in, "slots one migration moves into a rank (default 1)")
      ->check(CLI::NonNegativeNumber);
  memory_app->add_option("--migration-out", mem.migration_out, "slots one migration moves out of a rank (default 1)")
      ->check(CLI::NonNegativeNumber);
  memory_app->add_option("--overhead-mb", mem.overhead_mb, "the process's own memory in MiB (default: cpu measured, gpu 0)")
      ->check(CLI::NonNegativeNumber);
  memory_app->add_option("--context", mem.context, "with --card: context length for the KV cache")
      ->check(CLI::PositiveNumber);
  memory_app->add_option("--sequences", mem.sequences, "with --card: sequences whose KV cache is held")
      ->check(CLI::PositiveNumber);
  memory_app->add_flag("--json", mem.json, "JSON output");

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    int code = app.exit(e);
    return code == 0 ? 0 : 2;
  }
  try {
    if (*optimize_app) return optimize_cmd(opt, tf);
    if (*evaluate_app) return evaluate_cmd(config, trace, tokens, placement_path, tf, as_json);
    if (*diff_app) return diff_cmd(old_path, new_path, as_json);
    if (*stats_app) return stats_cmd(stats_path, as_json, full);
    if (*make_app) return make_cmd(policy, ranks, layers, experts, seed, replicas, out);
    if (*check_app) return check_cmd(check, check_tf);
    if (*convert_app) return convert_trace_cmd(from, out);
    if (*memory_app) return moed::apps::memory_cmd(mem);
  } catch (const moed::Error& e) {
    std::cerr << "moe-place: " << e.describe() << "\n";
    return e.exit_code();
  }
  return 2;
}
