// moectl's pure parts: its command line (built from the protocol's command
// table, so that moectl and the daemon cannot drift), and the human rendering
// of the daemon's answers and of migration progress. No sockets, no globals.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "common/int_ranges.h"  // format_ranges, for the placement table
#include "runtime/admin/protocol.h"

namespace moed::runtime::admin {

// moectl's exit codes.
inline constexpr int kExitOk = 0;
inline constexpr int kExitError = 1;        // an error answer, or a migration aborted
inline constexpr int kExitUsage = 2;        // bad command line
inline constexpr int kExitConnect = 3;      // no socket, refused, timeout, connection lost

// What moectl reads from its environment (kept out of the parser for tests).
struct MoectlEnv {
  std::string run_dir;  // $MOED_RUN_DIR, empty when unset
  unsigned uid = 0;
  std::string cwd;      // relative --dump paths are made absolute against it
};

struct Invocation {
  std::string socket;      // the socket to connect to
  // The run dir, when the socket is rank 0's by default (no --socket, no
  // --rank): if it does not answer, the lowest rank whose socket there does
  // is used (after a lost rank 0, elastic serving's coordinator).
  std::string coordinator_dir;
  bool as_json = false;    // --json: print the daemon's answer lines as they are
  double timeout_s = 30;   // per request: connect, send, answer
  std::string command;
  json request;            // {"cmd": ..., params}; moectl adds the id
  bool follow = false;     // poll `migration` until the migration ends
};

// Parses moectl's arguments (args[0] is the program name). On success
// `invocation` is set; otherwise `exit_code` is 0 (--help, --version) or 2 and
// `out` / `err` hold what to print.
struct CommandLine {
  std::optional<Invocation> invocation;
  int exit_code = kExitOk;
  std::string out, err;
};
CommandLine parse_command_line(const std::vector<std::string>& args, const MoectlEnv& env);

// "moectl: <code>: <message>" for an error answer (`answer` is the whole answer).
std::string format_error(const json& answer);

// The human rendering of an ok answer to `command`, ending with a newline
// (empty for an answer with nothing to show). Unknown shapes fall back to
// aligned "key: value" lines, so a daemon that adds fields never breaks moectl.
std::string format_answer(const std::string& command, const json& answer);

// Aligned "key   value" lines of an object's fields (id and ok left out).
std::string format_fields(const json& object, const std::vector<std::string>& first = {});

// The migration an answer names: "migration": N, or "migration": {"id": N, ...}.
std::optional<std::int64_t> migration_id_of(const json& answer);
// True for the states a migration ends in: committed, aborted.
bool migration_finished(const json& migration);
bool migration_aborted(const json& migration);

// "migration 3: transfer 45% (15.6 of 34.6 MB)", for a log or a pipe.
std::string progress_line(const json& migration);
// "migration 3 [#########...........]  45% transfer 15.6 of 34.6 MB", for a
// terminal; `width` is the bar's width in characters.
std::string progress_bar(const json& migration, int width = 30);

// "15.6 of 34.6 MB": both in the unit that suits `total` (B, kB, MB, GB; 10^3 steps).
std::string format_byte_pair(std::uint64_t done, std::uint64_t total);

}  // namespace moed::runtime::admin
