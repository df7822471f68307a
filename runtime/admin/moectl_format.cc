#include "runtime/admin/moectl_format.h"

#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <deque>
#include <filesystem>
#include <map>
#include <sstream>

namespace moed::runtime::admin {
namespace {

// ---- Command line -----------------------------------------------------------

// Parameters given as positional arguments rather than --options, by command.
const std::map<std::string, std::vector<std::pair<std::string, std::string>>>& positionals() {
  static const std::map<std::string, std::vector<std::pair<std::string, std::string>>> table{
      {"migrate", {{"layer", "LAYER"}, {"expert", "EXPERT"}, {"to", "TO"}}},
      {"migration", {{"migration_id", "ID"}}},
      {"trace", {{"request_id", "REQUEST_ID"}}},
  };
  return table;
}

std::string option_name(const std::string& param) {
  std::string out = "--" + param;
  std::replace(out.begin(), out.end(), '_', '-');
  return out;
}

// One parameter's value as CLI11 fills it, and where it goes in the request.
struct Holder {
  const ParamSpec* spec = nullptr;
  CLI::Option* option = nullptr;
  std::int64_t integer = 0;
  std::string text;
  bool flag = false;
};

struct SubcommandState {
  const CommandSpec* spec = nullptr;
  CLI::App* app = nullptr;
  std::deque<Holder> holders;  // deque: CLI11 keeps pointers into it
  bool apply = false;          // reoptimize --apply
  bool dry_run = false;        // reoptimize --dry-run (the default anyway)
  CLI::Option* apply_option = nullptr;
};

void add_param(SubcommandState& state, const ParamSpec& p) {
  Holder& h = state.holders.emplace_back();
  h.spec = &p;
  std::string name = option_name(p.name);
  if (auto it = positionals().find(state.spec->name); it != positionals().end())
    for (const auto& [param, shown] : it->second)
      if (param == p.name) name = shown;
  switch (p.type) {
    case ParamType::Bool:
      h.option = state.app->add_flag(name, h.flag, p.doc);
      break;
    case ParamType::Int:
      h.option = state.app->add_option(name, h.integer, p.doc)->check(CLI::Range(p.min, p.max));
      break;
    case ParamType::Path:
      // Not checked here: the daemon writes the file, and says why it cannot.
      h.option = state.app->add_option(name, h.text, p.doc)->type_name("PATH");
      break;
    case ParamType::Choice:
      h.option = state.app->add_option(name, h.text, p.doc)->check(CLI::IsMember(p.choices));
      break;
  }
  if (p.required) h.option->required();
}

json request_of(const SubcommandState& state, const MoectlEnv& env) {
  json request{{"cmd", state.spec->name}};
  for (const Holder& h : state.holders) {
    if (h.option->count() == 0) continue;
    switch (h.spec->type) {
      case ParamType::Bool:
        request[h.spec->name] = h.flag;
        break;
      case ParamType::Int:
        request[h.spec->name] = h.integer;
        break;
      case ParamType::Path: {
        // The daemon's working directory is not ours: send an absolute path.
        std::filesystem::path path(h.text);
        if (path.is_relative()) path = std::filesystem::path(env.cwd) / path;
        request[h.spec->name] = path.lexically_normal().string();
        break;
      }
      case ParamType::Choice:
        request[h.spec->name] = h.text;
        break;
    }
  }
  return request;
}

// ---- Rendering ----------------------------------------------------------------

std::string value_text(const json& v) {
  if (v.is_null()) return "none";
  if (v.is_string()) return v.get<std::string>();
  if (v.is_number_float()) {
    const double d = v.get<double>();
    return std::abs(d) >= 100 ? fmt::format("{:.1f}", d) : fmt::format("{:.4g}", d);
  }
  if (v.is_array() && std::all_of(v.begin(), v.end(), [](const json& e) { return e.is_string(); })) {
    if (v.empty()) return "none";
    std::string out;
    for (const auto& e : v) out += (out.empty() ? "" : "; ") + e.get<std::string>();
    return out;
  }
  return v.dump(-1, ' ', false, json::error_handler_t::replace);
}

std::int64_t int_field(const json& j, const char* key, std::int64_t fallback = -1) {
  auto it = j.find(key);
  return it != j.end() && it->is_number_integer() ? it->get<std::int64_t>() : fallback;
}

std::string string_field(const json& j, const char* key) {
  auto it = j.find(key);
  return it != j.end() && it->is_string() ? it->get<std::string>() : "";
}

int percent_of(const json& m) {
  const std::string state = string_field(m, "state");
  if (state == "committed" || state == "release" || state == "commit" || state == "verify")
    return 100;
  const std::int64_t total = int_field(m, "bytes", 0), done = int_field(m, "done_bytes", 0);
  if (total <= 0) return 0;
  return static_cast<int>(std::clamp<std::int64_t>(done * 100 / total, 0, 100));
}

// "layer 1 expert 5, rank 0 -> rank 2", leaving out what the answer lacks
// (empty without a layer and an expert: a migration of several moves).
std::string move_text(const json& m) {
  if (int_field(m, "layer") < 0 || int_field(m, "expert") < 0) return "";
  std::string out = fmt::format("layer {} expert {}", int_field(m, "layer"), int_field(m, "expert"));
  const std::int64_t from = int_field(m, "from"), to = int_field(m, "to"), drop = int_field(m, "drop");
  const std::int64_t shards = int_field(m, "shards");
  const auto cut_field = m.find("cut");
  const bool cut = cut_field != m.end() && cut_field->is_boolean() && cut_field->get<bool>();
  const std::int64_t copy = int_field(m, "copy");
  const std::string of_copy = copy > 0 ? fmt::format(" (copy {})", copy) : "";
  if (cut && to >= 0)
    return out + fmt::format(", split: shard {} of {}{} to rank {}, cut from rank {}", int_field(m, "shard"), shards,
                             of_copy, to, from);
  if (cut) return out + fmt::format(", split into {} shards: releases rank {}", shards, drop);
  if (shards > 1) out += fmt::format(", shard {} of {}{}", int_field(m, "shard"), shards, of_copy);
  if (from >= 0 && to >= 0) out += fmt::format(", rank {} -> rank {}", from, to);
  else if (to >= 0) out += fmt::format(" to rank {}", to);
  else if (drop >= 0) out += fmt::format(", releases rank {}", drop);
  return out;
}

std::string format_status(const json& answer) {
  json shown = answer;
  if (auto it = shown.find("migration"); it != shown.end()) {
    if (it->is_object()) *it = progress_line(*it).substr(std::string("migration ").size());
  }
  for (const char* rate : {"tokens_per_s", "recent_tokens_per_s"})
    if (auto it = shown.find(rate); it != shown.end() && it->is_number())
      *it = fmt::format("{:.1f}", it->get<double>());
  // Elastic serving: "epoch 3, world ranks 0 2 3 4 (this one 3 of 4), 1 rank lost, 1 joined".
  if (auto it = shown.find("survivors"); it != shown.end() && it->is_object()) {
    const json members = it->value("members", json::array());
    std::string ranks;
    for (const json& m : members) ranks += (ranks.empty() ? "" : " ") + value_text(m);
    const std::size_t lost = it->value("ranks_lost", it->value("losses", json::array()).size());
    const std::size_t joined = it->value("ranks_joined", std::size_t(0));
    *it = fmt::format("epoch {}, world ranks {} (this one {} of {}), {} rank{} lost{}",
                      value_text(it->value("epoch", json())), ranks, value_text(it->value("rank", json())),
                      members.size(), lost, lost == 1 ? "" : "s", joined ? fmt::format(", {} joined", joined) : "");
  }
  return format_fields(shown, {"rank", "state", "epoch", "survivors", "step", "tokens_per_s", "recent_tokens_per_s", "alerts",
                               "migration"});
}

// The summary line, then one row per layer. Falls back to fields for a
// shape it does not know.
std::string format_stats(const json& answer) {
  const json* layers = answer.contains("per_layer") ? &answer["per_layer"] : nullptr;
  if (!layers || !layers->is_array()) return format_fields(answer);
  std::string out = fmt::format("statistics of {} steps (half-life {} steps), {} sampled token paths\n",
                                value_text(answer.value("steps", json())),
                                value_text(answer.value("half_life_steps", json())),
                                value_text(answer.value("sample_tokens", json())));
  // With bias balancing, each layer's range of router biases.
  const bool biases = !layers->empty() && (*layers)[0].is_object() && (*layers)[0].contains("router_bias");
  out += fmt::format("{:<6} {:>10}  {:<15} {:>10}  {}\n", "layer", "tokens", "hottest expert", "x mean",
                     biases ? "most co-routed pair  router bias min..max" : "most co-routed pair");
  for (const json& l : *layers) {
    if (!l.is_object() || !l.value("top_pair", json()).is_array() || l["top_pair"].size() != 2)
      return format_fields(answer);
    std::string bias;
    if (biases) {
      const json b = l.value("router_bias", json());
      if (!b.is_array() || b.empty() || !std::all_of(b.begin(), b.end(), [](const json& v) { return v.is_number(); }))
        return format_fields(answer);
      const auto [lo, hi] = std::minmax_element(b.begin(), b.end(),
                                                [](const json& x, const json& y) { return x.get<double>() < y.get<double>(); });
      bias = fmt::format("  {:+.4f}..{:+.4f}", lo->get<double>(), hi->get<double>());
    }
    const std::string pair = fmt::format("{} + {}", value_text(l["top_pair"][0]), value_text(l["top_pair"][1]));
    out += fmt::format("{:<6} {:>10.0f}  {:<15} {:>10.2f}  {}\n", int_field(l, "layer"), l.value("tokens", 0.0),
                       int_field(l, "hottest_expert"), l.value("hottest_over_mean", 0.0),
                       biases ? fmt::format("{:<19}{}", pair, bias) : pair);
  }
  return out;
}

// Rows: layers; columns: ranks; cells: the experts with a slot there.
std::string format_placement(const json& answer) {
  auto slots = answer.find("slots");
  if (slots == answer.end() || !slots->is_array()) return format_fields(answer);
  int ranks = static_cast<int>(int_field(answer, "ranks", 0));
  std::vector<std::vector<std::vector<int>>> cells;  // [layer][rank] -> experts
  for (const auto& layer : *slots) {
    if (!layer.is_array()) return format_fields(answer);
    std::vector<std::vector<int>> row(std::max(ranks, 0));
    for (std::size_t e = 0; e < layer.size(); ++e) {
      if (!layer[e].is_array()) return format_fields(answer);
      for (const auto& r : layer[e]) {
        if (!r.is_number_integer() || r.get<std::int64_t>() < 0 || r.get<std::int64_t>() > 1 << 20)
          return format_fields(answer);
        const int rank = r.get<int>();
        if (rank >= static_cast<int>(row.size())) row.resize(rank + 1);
        row[rank].push_back(static_cast<int>(e));
      }
    }
    ranks = std::max(ranks, static_cast<int>(row.size()));
    cells.push_back(std::move(row));
  }
  // Rows are named by the model's layer numbers (dense layers take numbers too), when the answer has them.
  std::vector<std::string> names;
  const json numbers = answer.value("model_layers", json());
  for (std::size_t l = 0; l < cells.size(); ++l)
    names.push_back(numbers.is_array() && l < numbers.size() && numbers[l].is_number_integer()
                        ? std::to_string(numbers[l].get<std::int64_t>())
                        : std::to_string(l));
  std::vector<std::vector<std::string>> table;
  table.push_back({"layer"});
  for (int r = 0; r < ranks; ++r) table[0].push_back(fmt::format("rank {}", r));
  for (std::size_t l = 0; l < cells.size(); ++l) {
    std::vector<std::string> row{names[l]};
    cells[l].resize(ranks);
    for (auto& experts : cells[l]) row.push_back(experts.empty() ? "-" : format_ranges(experts));
    table.push_back(std::move(row));
  }
  std::vector<std::size_t> width(ranks + 1, 0);
  for (const auto& row : table)
    for (std::size_t c = 0; c < row.size(); ++c) width[c] = std::max(width[c], row[c].size());

  std::string out = fmt::format("placement epoch {}: {} ranks, {} layers", int_field(answer, "epoch", 0),
                                ranks, cells.size());
  if (auto e = int_field(answer, "experts"); e >= 0) out += fmt::format(", {} experts", e);
  out += "\n";
  if (const json slot = answer.value("slot", json()); slot.is_object() && slot.value("bytes", json()).is_number()) {
    out += fmt::format("slots hold experts in {}: {:.3f} MB each", slot.value("dtype", json("?")).is_string()
                                                                         ? slot["dtype"].get<std::string>()
                                                                         : "?",
                       slot["bytes"].get<double>() / 1e6);
    if (const json shards = slot.value("shard_bytes", json()); shards.is_object())
      for (const auto& [count, bytes] : shards.items())
        if (bytes.is_number()) out += fmt::format(", a shard of {}: {:.3f} MB", count, bytes.get<double>() / 1e6);
    out += "\n";
  }
  if (const json groups = answer.value("expert_groups", json()); groups.is_object())
    out += fmt::format("experts in {} groups of {} (ids in order); a token's experts come from {} of them\n",
                       int_field(groups, "groups"), int_field(groups, "size"), int_field(groups, "kept"));
  for (const auto& row : table) {
    std::string line;
    for (std::size_t c = 0; c < row.size(); ++c)
      line += fmt::format("{:<{}}", row[c], c + 1 < row.size() ? width[c] + 2 : 0);
    out += line + "\n";
  }
  // Split experts: a cell lists a shard like a whole copy, so name them, copy by copy.
  const auto split = answer.find("split"), shards = answer.find("shards");
  if (split != answer.end() && split->is_array() && shards != answer.end() && shards->is_array())
    for (std::size_t l = 0; l < split->size() && l < slots->size() && l < shards->size(); ++l) {
      if (!(*split)[l].is_array() || !(*shards)[l].is_object()) continue;
      for (const auto& e : (*split)[l]) {
        if (!e.is_number_integer()) continue;
        const json copies = (*shards)[l].value(std::to_string(e.get<std::int64_t>()), json());
        if (!copies.is_array() || copies.empty() || !copies[0].is_array()) continue;
        std::vector<std::string> held;
        for (const auto& ranks : copies) {
          std::vector<std::string> ranks_of;
          for (const auto& r : ranks) ranks_of.push_back(r.is_number_integer() ? std::to_string(r.get<int>()) : "?");
          held.push_back(fmt::format("{}", fmt::join(ranks_of, ", ")));
        }
        out += fmt::format("layer {} expert {}: split into {} shards, {}on ranks {}\n", names[l], e.get<int>(),
                           copies[0].size(), copies.size() > 1 ? fmt::format("{} copies, ", copies.size()) : "",
                           fmt::join(held, "; "));
      }
    }
  return out;
}

std::string format_reoptimize(const json& answer) {
  const bool dry_run = answer.value("dry_run", false);
  const json moves = answer.contains("moves") && answer["moves"].is_array() ? answer["moves"]
                                                                            : json::array();
  std::string out = fmt::format("reoptimize{}: {} move{}\n", dry_run ? " (dry run)" : "",
                                moves.size(), moves.size() == 1 ? "" : "s");
  if (auto predicted = answer.find("predicted"); predicted != answer.end() && predicted->is_object()) {
    std::size_t width = 0;
    for (const auto& [name, v] : predicted->items()) width = std::max(width, name.size());
    for (const auto& [name, v] : predicted->items()) {
      if (v.is_object() && v.contains("now") && v.contains("after") && v["now"].is_number() &&
          v["after"].is_number()) {
        const double now = v["now"].get<double>(), after = v["after"].get<double>();
        std::string change = now != 0 ? fmt::format("  ({:+.1f}%)", (after - now) / now * 100) : "";
        out += fmt::format("  {:<{}}  {} -> {}{}\n", name, width, value_text(v["now"]),
                           value_text(v["after"]), change);
      } else {
        out += fmt::format("  {:<{}}  {}\n", name, width, value_text(v));
      }
    }
  }
  if (auto pooling = answer.find("pooling"); pooling != answer.end() && pooling->is_string())
    out += "  " + pooling->get<std::string>() + "\n";
  constexpr std::size_t kShown = 20;
  for (std::size_t i = 0; i < moves.size() && i < kShown; ++i) {
    const std::string move = move_text(moves[i]);
    out += "  move " + (move.empty() ? value_text(moves[i]) : move) + "\n";
  }
  if (moves.size() > kShown) out += fmt::format("  ... and {} more moves\n", moves.size() - kShown);
  if (auto id = migration_id_of(answer)) out += fmt::format("migration {} started\n", *id);
  return out;
}

std::string us_text(const json& v) { return v.is_number() ? fmt::format("{:.0f} us", v.get<double>()) : "?"; }

std::string bytes_text(std::uint64_t bytes) {
  if (bytes >= 1000000) return fmt::format("{:.1f} MB", bytes / 1e6);
  if (bytes >= 1000) return fmt::format("{:.1f} kB", bytes / 1e3);
  return fmt::format("{} B", bytes);
}

std::string join_ints(const json& list) {
  std::string out;
  if (!list.is_array()) return "?";
  for (const auto& v : list) out += (out.empty() ? "" : ", ") + value_text(v);
  return out;
}

// One traced layer: its experts, where it went, and its phases on the home.
std::string format_trace_layer(const json& l) {
  const json home = l.value("home", json::object());
  std::string out = fmt::format("layer {}  step {}  epoch {}  home rank {} (island {})\n", int_field(l, "layer"),
                                int_field(l, "step"), int_field(l, "epoch"), int_field(home, "rank"),
                                int_field(home, "island"));
  std::string experts;
  for (const auto& e : l.value("experts", json::array())) {
    experts += (experts.empty() ? "" : ", ") +
               fmt::format("{} (w {:.3f}) on rank {}", int_field(e, "expert"), e.value("weight", 0.0),
                           e.value("rank", json()).is_number() ? std::to_string(int_field(e, "rank")) : "?");
    if (e.contains("expert_us"))
      experts += fmt::format(" [queue {}, expert {}]", us_text(e["queue_us"]), us_text(e["expert_us"]));
  }
  out += "  experts  " + experts + "\n";
  const json bytes = l.value("bytes", json::object());
  const std::uint64_t moved = bytes.value("rows", std::uint64_t{0}) + bytes.value("answers", std::uint64_t{0});
  out += fmt::format("  visited  ranks {}; islands {}; {} moved ({} across islands)\n",
                     join_ints(l.value("ranks", json())), join_ints(l.value("islands", json())), bytes_text(moved),
                     bytes_text(bytes.value("cross_island", std::uint64_t{0})));
  const json p = l.value("phases_us", json::object());
  out += fmt::format("  phases   route {}, plan {}, dispatch {}, wait {}, combine {} = {}\n",
                     us_text(p.value("route", json())), us_text(p.value("plan", json())),
                     us_text(p.value("dispatch", json())), us_text(p.value("wait", json())),
                     us_text(p.value("combine", json())), us_text(p.value("total", json())));
  if (const json s = l.value("slowest_expert", json()); s.is_object())
    out += fmt::format("  slowest  expert {} on rank {}: rows travel {}, queue {}, expert {}, answer wait {}, "
                       "answer travel {}\n",
                       int_field(s, "expert"), int_field(s, "rank"), us_text(s.value("rows_travel_us", json())),
                       us_text(s.value("queue_us", json())), us_text(s.value("expert_us", json())),
                       us_text(s.value("answer_wait_us", json())), us_text(s.value("answer_travel_us", json())));
  return out;
}

std::string format_trace(const json& answer) {
  const json tokens = answer.value("tokens", json());
  if (!tokens.is_array()) return format_fields(answer);
  std::string out;
  for (const auto& t : tokens) {
    if (!t.is_object() || !t.value("layers", json()).is_array()) return format_fields(answer);
    out += fmt::format("request {} position {}: {} of {} layers traced\n", value_text(answer.value("request_id", json())),
                       int_field(t, "position"), int_field(t, "layers_traced"), int_field(t, "model_layers"));
    for (const auto& l : t["layers"]) out += format_trace_layer(l);
  }
  return out;
}

}  // namespace

CommandLine parse_command_line(const std::vector<std::string>& args, const MoectlEnv& env) {
  CLI::App app{
      "moectl: controls a running moed through its admin socket.\n"
      "Exit codes: 0 ok, 1 error from the daemon (or a migration aborted), 2 bad usage, "
      "3 cannot connect.",
      "moectl"};
  app.set_version_flag("--version", "moectl 0.1.0");
  app.require_subcommand(1);
  app.fallthrough();  // global options may also follow the command
  std::string socket, dir;
  int rank = 0;
  bool json_output = false;
  double timeout = 30;
  auto* socket_opt = app.add_option("--socket", socket, "the admin socket to use")->type_name("PATH");
  app.add_option("--dir", dir, "the daemons' run dir (default: $MOED_RUN_DIR or /tmp/moed-$UID)")
      ->type_name("DIR")
      ->excludes(socket_opt);
  app.add_option("--rank", rank, "the rank whose socket to use (default 0)")
      ->check(CLI::NonNegativeNumber)
      ->excludes(socket_opt);
  app.add_flag("--json", json_output, "print the daemon's answers as JSON lines");
  app.add_option("--timeout", timeout, "seconds to wait for each answer (default 30)")
      ->check(CLI::PositiveNumber);

  std::deque<SubcommandState> states;
  bool follow_trace = false;
  for (const CommandSpec& spec : commands()) {
    if (spec.name == "trace_follow") continue;  // moectl trace --follow
    SubcommandState& state = states.emplace_back();
    state.spec = &spec;
    state.app = app.add_subcommand(spec.name, spec.doc);
    for (const ParamSpec& p : spec.params) {
      if (spec.name == "reoptimize" && p.name == "dry_run") continue;  // below, with --apply
      add_param(state, p);
    }
    if (spec.name == "trace")
      state.app->add_flag("--follow", follow_trace,
                          "trace this request from the next step on (whatever [trace].sample says), wait for "
                          "its first traced token (at most --timeout seconds) and show it");
    if (spec.name == "reoptimize") {
      // Re-optimising moves weights: moectl asks for it explicitly (--apply)
      // and otherwise only predicts (a dry run).
      auto* dry = state.app->add_flag("--dry-run", state.dry_run, "only predict the gain and list the moves (the default)");
      state.apply_option =
          state.app->add_flag("--apply", state.apply, "migrate to the new placement and follow it to the commit")
              ->excludes(dry);
    }
  }

  std::vector<const char*> argv;
  for (const auto& a : args) argv.push_back(a.c_str());
  CommandLine result;
  try {
    app.parse(static_cast<int>(argv.size()), argv.data());
  } catch (const CLI::ParseError& e) {
    std::ostringstream out, err;
    const int code = app.exit(e, out, err);
    result.exit_code = code == 0 ? kExitOk : kExitUsage;
    result.out = out.str();
    result.err = err.str();
    return result;
  }

  Invocation inv;
  inv.as_json = json_output;
  inv.timeout_s = timeout;
  const std::string run_dir = !dir.empty() ? dir : default_run_dir(env.run_dir.c_str(), env.uid);
  inv.socket = !socket.empty() ? socket : socket_path(run_dir, rank);
  if (socket.empty() && app.get_option("--rank")->count() == 0) inv.coordinator_dir = run_dir;
  for (const SubcommandState& state : states) {
    if (!state.app->parsed()) continue;
    inv.command = state.spec->name;
    inv.request = request_of(state, env);
    if (inv.command == "reoptimize") {
      inv.request["dry_run"] = !state.apply;
      inv.follow = state.apply;
    }
    if (inv.command == "migrate") inv.follow = true;
    if (inv.command == "trace" && follow_trace) {
      inv.command = "trace_follow";
      inv.request["cmd"] = "trace_follow";
      inv.follow = true;
    }
  }
  result.invocation = std::move(inv);
  return result;
}

std::string format_error(const json& answer) {
  std::string code = "error", message;
  if (auto it = answer.find("error"); it != answer.end() && it->is_object()) {
    code = string_field(*it, "code");
    message = string_field(*it, "message");
  }
  if (code.empty()) code = "error";
  return "moectl: " + code + ": " + message;
}

std::string format_fields(const json& object, const std::vector<std::string>& first) {
  if (!object.is_object()) return value_text(object) + "\n";
  std::vector<std::string> keys;
  for (const auto& k : first)
    if (object.contains(k)) keys.push_back(k);
  for (const auto& [k, v] : object.items())
    if (k != "id" && k != "ok" && std::find(keys.begin(), keys.end(), k) == keys.end()) keys.push_back(k);
  std::size_t width = 0;
  for (const auto& k : keys) width = std::max(width, k.size());
  std::string out;
  for (const auto& k : keys) out += fmt::format("{:<{}}  {}\n", k, width, value_text(object[k]));
  return out;
}

std::string format_answer(const std::string& command, const json& answer) {
  if (!answer.is_object()) return value_text(answer) + "\n";
  if (command == "status") return format_status(answer);
  if (command == "metrics") {
    if (auto it = answer.find("text"); it != answer.end() && it->is_string()) {
      std::string text = it->get<std::string>();
      if (!text.empty() && text.back() != '\n') text += '\n';
      return text;
    }
  }
  if (command == "placement") return format_placement(answer);
  if (command == "trace") return format_trace(answer);
  if (command == "trace_follow") return "";  // the trace follows
  if (command == "reoptimize") return format_reoptimize(answer);
  if (command == "migration") {
    if (auto it = answer.find("migration"); it != answer.end()) {
      if (it->is_object()) return progress_line(*it) + "\n";
      if (it->is_null()) return "no migration\n";
    }
  }
  if (command == "migrate") {
    if (auto id = migration_id_of(answer)) {
      const json& m = answer["migration"];
      const std::string move = m.is_object() ? move_text(m) : "";
      return fmt::format("migration {} started{}\n", *id, move.empty() ? "" : ": " + move);
    }
  }
  if (command == "stats" && answer.contains("dump") && answer["dump"].is_string())
    return "statistics written to " + answer["dump"].get<std::string>() + "\n";
  if (command == "stats") return format_stats(answer);
  return format_fields(answer);
}

std::optional<std::int64_t> migration_id_of(const json& answer) {
  auto it = answer.find("migration");
  if (it == answer.end()) return std::nullopt;
  if (it->is_number_integer()) return it->get<std::int64_t>();
  if (it->is_object()) {
    const std::int64_t id = int_field(*it, "id");
    if (id >= 0) return id;
  }
  return std::nullopt;
}

bool migration_finished(const json& migration) {
  const std::string state = string_field(migration, "state");
  return state == "committed" || state == "aborted";
}

bool migration_aborted(const json& migration) { return string_field(migration, "state") == "aborted"; }

std::string progress_line(const json& m) {
  const std::string state = string_field(m, "state");
  std::string out = fmt::format("migration {}: {}", int_field(m, "id"), state.empty() ? "?" : state);
  const std::int64_t total = int_field(m, "bytes", 0), done = int_field(m, "done_bytes", 0);
  if (state == "transfer" && total > 0) {
    out += fmt::format(" {}% ({})", percent_of(m), format_byte_pair(done, total));
  } else if (state == "committed") {
    std::vector<std::string> parts;
    if (std::string move = move_text(m); !move.empty()) parts.push_back(move);
    if (const std::int64_t moves = int_field(m, "moves"); moves >= 0)
      parts.push_back(fmt::format("{} move{}", moves, moves == 1 ? "" : "s"));
    if (total > 0) {
      const std::string pair = format_byte_pair(total, total);  // "34.6 of 34.6 MB"
      parts.push_back(pair.substr(pair.find(" of ") + 4) + " moved");
    }
    for (std::size_t i = 0; i < parts.size(); ++i) out += (i ? "; " : " (") + parts[i];
    if (!parts.empty()) out += ")";
  } else if (state == "aborted") {
    const std::string error = string_field(m, "error");
    out += error.empty() ? " (before commit; serving goes on with the old placement)" : ": " + error;
  }
  return out;
}

std::string progress_bar(const json& m, int width) {
  width = std::max(width, 1);
  const int percent = percent_of(m);
  const int filled = percent * width / 100;
  const std::string state = string_field(m, "state");
  std::string out = fmt::format("migration {} [{}{}] {:>3}% {}", int_field(m, "id"),
                                std::string(filled, '#'), std::string(width - filled, '.'), percent,
                                state.empty() ? "?" : state);
  const std::int64_t total = int_field(m, "bytes", 0), done = int_field(m, "done_bytes", 0);
  if (total > 0) out += " " + format_byte_pair(std::max<std::int64_t>(done, 0), total);
  return out;
}

std::string format_byte_pair(std::uint64_t done, std::uint64_t total) {
  struct Unit {
    double scale;
    const char* name;
  };
  static constexpr Unit units[] = {{1e9, "GB"}, {1e6, "MB"}, {1e3, "kB"}};
  for (const Unit& u : units)
    if (static_cast<double>(total) >= u.scale)
      return fmt::format("{:.1f} of {:.1f} {}", done / u.scale, total / u.scale, u.name);
  return fmt::format("{} of {} B", done, total);
}

}  // namespace moed::runtime::admin
