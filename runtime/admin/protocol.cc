#include "runtime/admin/protocol.h"

#include <algorithm>
#include <exception>
#include <string>

namespace moed::runtime::admin {
namespace {

ParamSpec int_param(std::string name, bool required, std::string doc,
                    std::int64_t max = INT32_MAX) {
  ParamSpec p;
  p.name = std::move(name);
  p.type = ParamType::Int;
  p.required = required;
  p.min = 0;
  p.max = max;
  p.doc = std::move(doc);
  return p;
}

std::vector<CommandSpec> build_commands() {
  std::vector<CommandSpec> table;
  table.push_back({"status", false, {}, "rank, epoch, step, tokens/s, alerts, state and any migration"});
  table.push_back({"metrics", false, {}, "the metrics in Prometheus text format (field \"text\")"});
  table.push_back({"placement", false, {}, "the placement served now: epoch and the ranks of every expert"});
  {
    ParamSpec dump;
    dump.name = "dump";
    dump.type = ParamType::Path;
    dump.doc = "write the statistics to this file (an absolute path) instead of summarising them";
    table.push_back({"stats", false, {dump}, "a summary of the routing statistics, or a dump to a file"});
  }
  {
    ParamSpec dry_run;
    dry_run.name = "dry_run";
    dry_run.type = ParamType::Bool;
    dry_run.default_value = false;
    dry_run.doc = "only predict the gain and list the moves";
    ParamSpec policy;
    policy.name = "policy";
    policy.type = ParamType::Choice;
    policy.choices = reoptimize_policies();
    policy.doc = "the placement policy to optimise with (default: [placement].reoptimize_policy)";
    table.push_back({"reoptimize",
                     true,
                     {dry_run,
                      int_param("max_moves", false, "at most this many expert moves (default: no limit)"),
                      policy},
                     "a better placement from the live statistics, then migrate to it"});
  }
  table.push_back({"migrate",
                   true,
                   {int_param("layer", true, "the MoE layer"), int_param("expert", true, "the expert"),
                    int_param("to", true, "the rank that receives a slot"),
                    int_param("from", false, "the rank whose slot moves (default: the daemon picks)")},
                   "move one expert's slot to another rank while serving"});
  // Not "id": that name is the request's own id.
  table.push_back({"migration",
                   false,
                   {int_param("migration_id", false, "which migration (default: the latest)", INT64_MAX)},
                   "the progress of a migration"});
  // Request ids above INT64_MAX cannot be named (JSON integers are read as int64).
  table.push_back({"trace",
                   false,
                   {int_param("request_id", true, "the request whose traced tokens to show", INT64_MAX)},
                   "a traced request's tokens: per layer, experts, ranks, bytes and phase times (rank 0)"});
  table.push_back({"trace_follow",
                   true,
                   {int_param("request_id", true, "the request to trace from the next step on", INT64_MAX)},
                   "trace this request's tokens whatever [trace].sample says (moectl trace --follow)"});
  table.push_back({"admit",
                   true,
                   {int_param("count", false, "how many spares (default 1)")},
                   "admit waiting spares ([comm].spares): each joins and a migration gives it its share of the slots"});
  table.push_back({"drain", true, {}, "finish the work in flight, then take no new tokens"});
  table.push_back({"shutdown", true, {}, "drain, then stop every rank"});
  return table;
}

const std::vector<CommandSpec>& table() {
  static const std::vector<CommandSpec> commands = build_commands();
  return commands;
}

// Serialises without ever throwing on invalid UTF-8 (replaced by U+FFFD).
std::string dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

std::string quoted_list(const std::vector<std::string>& names) {
  std::string out;
  for (std::size_t i = 0; i < names.size(); ++i) out += (i ? ", '" : "'") + names[i] + "'";
  return out;
}

std::string command_names() {
  std::string out;
  for (const auto& c : table()) out += (out.empty() ? "" : ", ") + c.name;
  return out;
}

std::string type_word(const json& value) {
  if (value.is_number_float()) return "the number " + dump(value);
  if (value.is_number()) return "the integer " + dump(value);
  if (value.is_string()) return "the string '" + excerpt(value.get_ref<const std::string&>()) + "'";
  return std::string(value.type_name());
}

Answer error(const json& id, std::string_view code, const std::string& message, bool close = false) {
  return Answer{answer_error(id, code, message), std::string(code), close};
}

std::string describe(const ParamSpec& p) {
  switch (p.type) {
    case ParamType::Bool:
      return "true or false";
    case ParamType::Int:
      return "an integer in [" + std::to_string(p.min) + ", " + std::to_string(p.max) + "]";
    case ParamType::Path:
      return "an absolute path";
    case ParamType::Choice: {
      std::string out = "one of ";
      for (std::size_t i = 0; i < p.choices.size(); ++i) out += (i ? ", " : "") + p.choices[i];
      return out;
    }
  }
  return "?";
}

// Empty when `value` fits `p`, else the reason.
std::string check_value(const ParamSpec& p, const json& value) {
  const std::string wanted = "'" + p.name + "' must be " + describe(p) + ", got ";
  switch (p.type) {
    case ParamType::Bool:
      return value.is_boolean() ? "" : wanted + type_word(value);
    case ParamType::Int: {
      if (!value.is_number_integer()) return wanted + type_word(value);
      // Unsigned values above INT64_MAX do not fit get<int64_t>: compare first.
      if (value.is_number_unsigned() &&
          value.get<std::uint64_t>() > static_cast<std::uint64_t>(p.max))
        return wanted + dump(value);
      const auto v = value.get<std::int64_t>();
      return v < p.min || v > p.max ? wanted + dump(value) : "";
    }
    case ParamType::Path: {
      if (!value.is_string()) return wanted + type_word(value);
      const auto& s = value.get_ref<const std::string&>();
      if (s.empty() || s.front() != '/' || s.find('\0') != std::string::npos || s.size() > 4096)
        return wanted + type_word(value);
      return "";
    }
    case ParamType::Choice: {
      if (!value.is_string()) return wanted + type_word(value);
      const auto& s = value.get_ref<const std::string&>();
      return std::find(p.choices.begin(), p.choices.end(), s) != p.choices.end()
                 ? ""
                 : wanted + type_word(value);
    }
  }
  return wanted + type_word(value);
}

std::variant<Request, Answer> validate(const json& object) {
  if (!object.is_object()) return error(nullptr, code::kBadJson, "a request must be a JSON object");

  Request request;
  if (auto it = object.find("id"); it != object.end()) {
    if (!it->is_null() && !it->is_string() && !it->is_number_integer())
      return error(nullptr, code::kBadParams, "'id' must be a string or an integer, got " + type_word(*it));
    request.id = *it;
  }

  auto cmd = object.find("cmd");
  if (cmd == object.end())
    return error(request.id, code::kBadParams, "missing 'cmd': one of " + command_names());
  if (!cmd->is_string())
    return error(request.id, code::kBadParams, "'cmd' must be a string, got " + type_word(*cmd));
  request.cmd = cmd->get<std::string>();
  const CommandSpec* spec = find_command(request.cmd);
  if (!spec)
    return error(request.id, code::kUnknownCommand,
                 "unknown command '" + excerpt(request.cmd) + "': use " + command_names());

  std::vector<std::string> unknown;
  for (const auto& item : object.items()) {
    // item.key(), not a structured binding: clang 14 cannot capture those.
    const std::string& key = item.key();
    if (key == "id" || key == "cmd") continue;
    const bool declared = std::any_of(spec->params.begin(), spec->params.end(),
                                      [&](const ParamSpec& p) { return p.name == key; });
    if (!declared) unknown.push_back(excerpt(key));
  }
  if (!unknown.empty()) {
    std::vector<std::string> accepted;
    for (const auto& p : spec->params) accepted.push_back(p.name);
    return error(request.id, code::kBadParams,
                 std::string(unknown.size() == 1 ? "unknown parameter " : "unknown parameters ") +
                     quoted_list(unknown) + " for '" + spec->name + "'" +
                     (accepted.empty() ? " (it takes none)" : " (it takes " + quoted_list(accepted) + ")"));
  }

  for (const auto& p : spec->params) {
    auto it = object.find(p.name);
    if (it == object.end()) {
      if (p.required)
        return error(request.id, code::kBadParams,
                     "missing '" + p.name + "' (" + describe(p) + ") for '" + spec->name + "'");
      if (!p.default_value.is_null()) request.params[p.name] = p.default_value;
      continue;
    }
    if (std::string why = check_value(p, *it); !why.empty())
      return error(request.id, code::kBadParams, why);
    request.params[p.name] = *it;
  }
  return request;
}

}  // namespace

const std::vector<std::string>& reoptimize_policies() {
  static const std::vector<std::string> names{"metis", "greedy-load", "contiguous", "round-robin"};
  return names;
}

std::span<const CommandSpec> commands() { return table(); }

const CommandSpec* find_command(std::string_view name) {
  for (const auto& c : table())
    if (c.name == name) return &c;
  return nullptr;
}

bool is_control(const std::string& cmd) {
  const CommandSpec* spec = find_command(cmd);
  return spec && spec->control;
}

bool is_blank(std::string_view line) {
  return line.find_first_not_of(" \t\r") == std::string_view::npos;
}

std::string excerpt(std::string_view text, std::size_t max_chars) {
  if (text.size() <= max_chars) return std::string(text);
  std::size_t cut = max_chars;
  // Do not cut a UTF-8 sequence in two: back up over continuation bytes.
  while (cut > 0 && (static_cast<unsigned char>(text[cut]) & 0xC0) == 0x80) --cut;
  return std::string(text.substr(0, cut)) + "...";
}

std::variant<Request, Answer> parse_request(std::string_view line, std::size_t max_line) {
  try {
    if (line.size() > max_line)
      return error(nullptr, code::kLineTooLong,
                   "request line longer than " + std::to_string(max_line) + " bytes", true);
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    json object;
    try {
      object = json::parse(line.begin(), line.end());
    } catch (const json::parse_error& e) {
      return error(nullptr, code::kBadJson,
                   "not JSON: syntax error at byte " + std::to_string(e.byte) + " of the line");
    }
    return validate(object);
  } catch (const std::exception& e) {
    // Only resource exhaustion gets here; keep the promise of an answer.
    return error(nullptr, code::kInternal, std::string("cannot parse the request: ") + e.what());
  }
}

std::string answer_ok(const json& id, json fields) {
  try {
    std::string out = "{\"id\":" + dump(id) + ",\"ok\":true";
    if (fields.is_object()) {
      for (const auto& [key, value] : fields.items()) {
        if (key == "id" || key == "ok") continue;
        out += "," + dump(json(key)) + ":" + dump(value);
      }
    }
    out += "}";
    return out;
  } catch (const std::exception&) {
    return R"({"id":null,"ok":false,"error":{"code":"internal","message":"cannot format the answer"}})";
  }
}

std::string answer_error(const json& id, std::string_view code, std::string_view message) {
  try {
    json err = json::object();
    err["code"] = std::string(code);
    err["message"] = std::string(message);
    return "{\"id\":" + dump(id) + ",\"ok\":false,\"error\":" + dump(err) + "}";
  } catch (const std::exception&) {
    return R"({"id":null,"ok":false,"error":{"code":"internal","message":"cannot format the answer"}})";
  }
}

json error_body(std::string_view code, std::string_view message) {
  return json{{"ok", false}, {"error", {{"code", std::string(code)}, {"message", std::string(message)}}}};
}

std::string socket_path(const std::string& dir, int rank) {
  std::string out = dir;
  if (out.empty()) out = ".";
  if (out.back() != '/') out += '/';
  return out + "moed-" + std::to_string(rank) + ".sock";
}

std::string default_run_dir(const char* env_value, unsigned uid) {
  if (env_value && *env_value) return env_value;
  return "/tmp/moed-" + std::to_string(uid);
}

json echo_id(const json& request) {
  if (!request.is_object()) return nullptr;
  auto it = request.find("id");
  if (it == request.end() || !(it->is_string() || it->is_number_integer())) return nullptr;
  return *it;
}

}  // namespace moed::runtime::admin
