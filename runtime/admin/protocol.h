// The admin socket's protocol: one JSON object per line each way.
//
// A request is {"id": <string or integer, optional>, "cmd": "<command>", ...params}.
// Every answer echoes the id (null when the request had none) and is either
//   {"id": ..., "ok": true, ...fields}
// or
//   {"id": ..., "ok": false, "error": {"code": "<code>", "message": "<text>"}}.
//
// The command table below (names, parameters, one-line docs) is shared by the
// server and by moectl, so that the two cannot drift apart.
//
// Pure: no sockets, no threads. Nothing here throws past the API on any input
// (the libFuzzer target tests/fuzz/fuzz_admin_protocol.cc holds it to that).
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include <nlohmann/json.hpp>

namespace moed::runtime::admin {

using json = nlohmann::json;

// The longest request line the server reads by default (the newline excluded).
inline constexpr std::size_t kDefaultMaxLine = 64 * 1024;

// Error codes of error answers.
namespace code {
inline constexpr std::string_view kBadJson = "bad_json";            // not JSON, not an object
inline constexpr std::string_view kLineTooLong = "line_too_long";   // connection closed after it
inline constexpr std::string_view kUnknownCommand = "unknown_command";
inline constexpr std::string_view kBadParams = "bad_params";        // message names the parameter
inline constexpr std::string_view kNotCoordinator = "not_coordinator";
inline constexpr std::string_view kBusy = "busy";                   // another migration runs
inline constexpr std::string_view kRefused = "refused";             // e.g. no memory
inline constexpr std::string_view kNotFound = "not_found";          // e.g. no trace of that request
inline constexpr std::string_view kAlreadyServed = "already_served";  // followed after its last step was served
inline constexpr std::string_view kInternal = "internal";
inline constexpr std::string_view kShuttingDown = "shutting_down";
// Connection-level refusals, sent as the only line before the server closes.
inline constexpr std::string_view kForbidden = "forbidden";         // peer uid not allowed
inline constexpr std::string_view kTooManyClients = "too_many_clients";
inline constexpr std::string_view kLineTimeout = "line_timeout";  // a line too slow to finish; closed
inline constexpr std::string_view kEvicted = "evicted";  // an unfinished line's slot, given to a new client
inline constexpr std::string_view kTooManyRequests = "too_many_requests";  // in flight, per client
}  // namespace code

enum class ParamType {
  Bool,
  Int,     // a JSON integer in [min, max]; floats and booleans are refused
  Path,    // a non-empty absolute path without NUL bytes
  Choice,  // one string of `choices`
};

struct ParamSpec {
  std::string name;
  ParamType type = ParamType::Int;
  bool required = false;
  json default_value;  // filled into Request::params when absent; null: left absent
  std::int64_t min = 0, max = INT32_MAX;  // Int
  std::vector<std::string> choices;        // Choice
  std::string doc;
};

struct CommandSpec {
  std::string name;
  // Control commands change the cluster: only the coordinator (rank 0) takes
  // them, and its daemon decides them at a step boundary (AdminServer::submit).
  // The others are answered at once from the daemon's published snapshot.
  bool control = false;
  std::vector<ParamSpec> params;
  std::string doc;
};

// Every command, in the order moectl lists them.
std::span<const CommandSpec> commands();
// nullptr for an unknown name.
const CommandSpec* find_command(std::string_view name);
// reoptimize, migrate, drain, shutdown.
bool is_control(const std::string& cmd);
// The placement policies `reoptimize` accepts; the first is the default.
const std::vector<std::string>& reoptimize_policies();

// A request that passed validation: `params` holds exactly the command's
// declared parameters that were given, plus the defaults of absent ones.
struct Request {
  json id;  // string, integer or null
  std::string cmd;
  json params = json::object();
};

// A ready error answer for a request that did not pass.
struct Answer {
  std::string line;  // without the trailing newline
  std::string code;
  bool close = false;  // the connection must be closed once it is written (line_too_long)
};

// Parses and validates one request line (without its newline; a trailing '\r'
// is ignored). Lines over `max_line` bytes are refused before parsing.
std::variant<Request, Answer> parse_request(std::string_view line,
                                            std::size_t max_line = kDefaultMaxLine);

// True when `line` holds only spaces, tabs and '\r': the server skips such lines.
bool is_blank(std::string_view line);

// {"id":id,"ok":true,...fields}, without newline. `fields` must be an object
// (or null); keys "id" and "ok" in it are ignored. Never throws: invalid UTF-8
// in strings is replaced with U+FFFD.
std::string answer_ok(const json& id, json fields);
// {"id":id,"ok":false,"error":{"code":code,"message":message}}, without newline.
std::string answer_error(const json& id, std::string_view code, std::string_view message);

// For handlers: an error body for AdminServer's snapshot_answer to return
// ({"ok":false,"error":{...}}), which the server turns into answer_error.
json error_body(std::string_view code, std::string_view message);

// The id to echo for a request object: its "id" when a string or an integer,
// else null.
json echo_id(const json& request);

// Where the daemon of `rank` listens: <dir>/moed-<rank>.sock.
std::string socket_path(const std::string& dir, int rank);
// The run directory when none is configured: $MOED_RUN_DIR when set and not
// empty (`env_value`, may be null), else /tmp/moed-<uid>. Shared by moed and
// moectl so that both find the same socket.
std::string default_run_dir(const char* env_value, unsigned uid);

// A short, printable excerpt of untrusted text for error messages.
std::string excerpt(std::string_view text, std::size_t max_chars = 64);

}  // namespace moed::runtime::admin
