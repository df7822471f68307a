// Routing traces: for each token and each MoE layer, the experts the router
// chose and their gate weights. moed replays them (routing fixed, hidden states
// synthetic) and moe-place evaluates placements on them.
//
// The project's own format is text ("moed-trace v1"):
//
//   moed-trace v1
//   # comments anywhere after the first line
//   layers 32
//   experts 8
//   top_k 2
//   tokens 338
//   6:0.695958376 5:0.304041624 | 1:0.5 3:0.5 | - | ...     (one line per token)
//
// A token line has one group per layer, separated by '|'; a group is '-' (no
// routing recorded for that layer) or 1..top_k distinct `expert:weight` pairs,
// weights finite and > 0, written with %.9g so that floats round-trip exactly.
// Every problem in a file is an Input error naming the origin and line number.
#pragma once

#include <cstddef>
#include <cstdint>
#include <iosfwd>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace moed::routing {

struct RoutingChoice {
  std::uint32_t expert;
  float weight;
  friend bool operator==(const RoutingChoice&, const RoutingChoice&) = default;
};

// Limits on the shape read from files, so that a corrupt number fails with a
// message instead of an enormous allocation.
inline constexpr int kMaxTraceLayers = 4096;
inline constexpr int kMaxTraceExperts = 65536;

class RoutingTrace {
 public:
  RoutingTrace(int layers, int experts);  // an empty trace of that shape

  int layers() const { return layers_; }
  int experts() const { return experts_; }
  int top_k() const { return top_k_; }  // the largest group seen so far (0 when none)
  std::size_t tokens() const { return (offsets_.size() - 1) / static_cast<std::size_t>(layers_); }

  // Appends one token: per layer its choices (possibly none). A wrong shape,
  // an expert out of range, a duplicate expert or a weight that is not finite
  // and > 0 is an Internal error: parsers validate file contents first.
  void add_token(const std::vector<std::vector<RoutingChoice>>& per_layer);
  // Appends tokens [first, end) of `from`, a trace of the same shape (else,
  // or for a range out of it, an Internal error).
  void append(const RoutingTrace& from, std::size_t first, std::size_t end);

  std::span<const RoutingChoice> at(std::size_t token, int layer) const;

  std::vector<std::string> comments;  // without the '#'; kept and written back

 private:
  int layers_;
  int experts_;
  int top_k_ = 0;
  // CSR: the choices of cell (token, layer) are choices_[offsets_[c], offsets_[c + 1])
  // with c = token * layers + layer.
  std::vector<std::size_t> offsets_{0};
  std::vector<RoutingChoice> choices_;
};

// Parses "moed-trace v1" text; `origin` (usually the path) prefixes messages.
RoutingTrace parse_trace(std::string_view text, const std::string& origin);

// Reads a trace file, detecting the format: a first line "moed-trace v1" is
// the text format, a first non-space character '{' is routing JSON lines
// (import_routing_jsonl). A missing file is an Input error.
RoutingTrace read_trace(const std::string& path);

void write_trace(const RoutingTrace& trace, std::ostream& out);
// Writes to a temporary file next to `path`, then renames it over `path`.
void write_trace_file(const RoutingTrace& trace, const std::string& path);

// Imports per-(layer, token) JSON lines as collected from vLLM for Mixtral:
//   {"problem_id":0,"layer":0,"experts":[6,5],"gating_probs":[0.696,0.304],"token_idx":0}
// Required: layer, experts, gating_probs; optional: problem_id (default 0),
// token_idx, token_pos, dataset. A record's token number is its token_idx,
// else its token_pos (the token's position in its sequence), else the count
// of earlier records of the same problem, call and layer. Within one
// problem_id, a layer that repeats after higher layers were seen starts a new
// forward call. A token is (problem_id, call, number); a call numbered by
// token_idx has max(token_idx) + 1 tokens and cells without a record become
// empty groups; in a call where token_pos numbered a record, only the
// numbers that have a record are tokens (positions are not dense: a decode
// step holds one late position, and a gap is not a token). Tokens are ordered
// by first appearance of their (problem, call), then number. layers and experts are
// the largest ids seen + 1. Adds comments naming the origin and the count of
// empty cells.
RoutingTrace import_routing_jsonl(std::string_view text, const std::string& origin);

}  // namespace moed::routing
