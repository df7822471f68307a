#include "routing/routing_trace.h"

#include <unistd.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <limits>
#include <map>
#include <ostream>
#include <set>
#include <utility>

#include "common/error.h"
#include "common/quote.h"
#include "common/mapped_file.h"

namespace moed::routing {

// ---------------------------------------------------------------- RoutingTrace

RoutingTrace::RoutingTrace(int layers, int experts) : layers_(layers), experts_(experts) {
  MOED_CHECK(layers >= 1 && experts >= 1, "trace shape {} layers x {} experts", layers, experts);
}

void RoutingTrace::add_token(const std::vector<std::vector<RoutingChoice>>& per_layer) {
  MOED_CHECK(per_layer.size() == static_cast<std::size_t>(layers_), "{} groups for {} layers",
             per_layer.size(), layers_);
  // Validate everything first so that a refused token leaves the trace unchanged.
  for (std::size_t layer = 0; layer < per_layer.size(); ++layer) {
    const auto& group = per_layer[layer];
    for (std::size_t i = 0; i < group.size(); ++i) {
      const RoutingChoice& c = group[i];
      MOED_CHECK(c.expert < static_cast<std::uint32_t>(experts_), "layer {}: expert {} of {}",
                 layer, c.expert, experts_);
      MOED_CHECK(std::isfinite(c.weight) && c.weight > 0, "layer {}: expert {} weight {}", layer,
                 c.expert, c.weight);
      for (std::size_t j = 0; j < i; ++j)
        MOED_CHECK(group[j].expert != c.expert, "layer {}: expert {} twice", layer, c.expert);
    }
  }
  for (const auto& group : per_layer) {
    choices_.insert(choices_.end(), group.begin(), group.end());
    offsets_.push_back(choices_.size());
    top_k_ = std::max(top_k_, static_cast<int>(group.size()));
  }
}

void RoutingTrace::append(const RoutingTrace& from, std::size_t first, std::size_t end) {
  MOED_CHECK(from.layers_ == layers_ && from.experts_ == experts_, "appending a trace of {} layers x {} experts to "
             "one of {} x {}", from.layers_, from.experts_, layers_, experts_);
  MOED_CHECK(first <= end && end <= from.tokens(), "tokens [{}, {}) of a trace of {}", first, end, from.tokens());
  const std::size_t L = static_cast<std::size_t>(layers_);
  const std::size_t begin_choice = from.offsets_[first * L], end_choice = from.offsets_[end * L];
  const std::size_t shift = choices_.size() - begin_choice;  // unsigned wrap-around cancels out below
  choices_.insert(choices_.end(), from.choices_.begin() + std::ptrdiff_t(begin_choice),
                  from.choices_.begin() + std::ptrdiff_t(end_choice));
  for (std::size_t c = first * L + 1; c <= end * L; ++c) offsets_.push_back(from.offsets_[c] + shift);
  if (end > first) top_k_ = std::max(top_k_, from.top_k_);
}

std::span<const RoutingChoice> RoutingTrace::at(std::size_t token, int layer) const {
  MOED_CHECK(token < tokens() && layer >= 0 && layer < layers_, "cell (token {}, layer {}) of {}x{}",
             token, layer, tokens(), layers_);
  std::size_t cell = token * static_cast<std::size_t>(layers_) + static_cast<std::size_t>(layer);
  return {choices_.data() + offsets_[cell], offsets_[cell + 1] - offsets_[cell]};
}

namespace {

constexpr std::string_view kMagic = "moed-trace v1";
constexpr std::string_view kSpace = " \t\r\v\f";
constexpr std::string_view kBlank = " \t\r\n\v\f";
// Bounds a token_idx from JSON lines, for the same reason as kMaxTraceLayers.
constexpr std::uint64_t kMaxCallTokens = std::uint64_t{1} << 20;

std::string_view trim(std::string_view s) {
  auto first = s.find_first_not_of(kSpace);
  if (first == std::string_view::npos) return {};
  return s.substr(first, s.find_last_not_of(kSpace) - first + 1);
}

// A line quoted in a message, cut when long.
// A piece of the file in a message: control and invalid bytes escaped (raw
// binary never reaches the log), cut after 60 bytes.
std::string quote(std::string_view s) { return sanitize_input(s, 60); }

// The lines of a text numbered from 1, without '\n' and a trailing '\r'.
class Lines {
 public:
  explicit Lines(std::string_view text) : text_(text) {}

  bool next(std::string_view& line) {
    if (pos_ >= text_.size()) return false;  // a final '\n' does not start another line
    std::size_t end = std::min(text_.find('\n', pos_), text_.size());
    line = text_.substr(pos_, end - pos_);
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    pos_ = end + 1;
    ++number_;
    return true;
  }
  // The number of the line last returned; 1 before the first (for messages).
  std::size_t number() const { return std::max<std::size_t>(number_, 1); }

 private:
  std::string_view text_;
  std::size_t pos_ = 0;
  std::size_t number_ = 0;
};

template <class T>
bool parse_number(std::string_view s, T& value) {
  const char* end = s.data() + s.size();
  auto [ptr, ec] = std::from_chars(s.data(), end, value);
  return ec == std::errc() && ptr == end && !s.empty();
}

// ------------------------------------------------------------- text format

class TextParser {
 public:
  TextParser(std::string_view text, const std::string& origin) : text_(text), lines_(text), origin_(origin) {}

  RoutingTrace parse() {
    std::string_view line;
    if (text_.find_first_not_of(kBlank) == std::string_view::npos) fail(1, "empty file, expected '{}' on line 1", kMagic);
    lines_.next(line);
    if (line.substr(0, line.find_last_not_of(kSpace) + 1) != kMagic)
      fail(1, "expected '{}' on line 1, got '{}'", kMagic, quote(line));

    auto layers = static_cast<int>(header("layers", kMaxTraceLayers));
    auto experts = static_cast<int>(header("experts", kMaxTraceExperts));
    top_k_ = static_cast<int>(header("top_k", static_cast<std::uint64_t>(experts)));
    std::uint64_t tokens = header("tokens", std::numeric_limits<std::uint64_t>::max());
    std::size_t tokens_line = lines_.number();

    RoutingTrace trace(layers, experts);
    per_layer_.resize(static_cast<std::size_t>(layers));
    std::uint64_t seen = 0;
    while (next_content(line)) {
      if (++seen > tokens)
        fail(lines_.number(), "more token lines than 'tokens {}' (line {}) says", tokens, tokens_line);
      parse_token_line(line, trace);
    }
    if (seen < tokens)
      fail(lines_.number(), "end of file after {} token lines, expected {} ('tokens {}' on line {})",
           seen, tokens, tokens, tokens_line);
    trace.comments = std::move(comments_);
    return trace;
  }

 private:
  template <class... Args>
  [[noreturn]] void fail(std::size_t line, fmt::format_string<Args...> format, Args&&... args) {
    MOED_THROW(Input, "{}:{}: {}", origin_, line, fmt::format(format, std::forward<Args>(args)...));
  }

  // The next line that is neither blank nor a comment; comments are collected.
  bool next_content(std::string_view& line) {
    while (lines_.next(line)) {
      std::string_view t = trim(line);
      if (t.empty()) continue;
      if (t.front() == '#') {
        t.remove_prefix(1);
        if (!t.empty() && t.front() == ' ') t.remove_prefix(1);
        comments_.emplace_back(t);
        continue;
      }
      line = t;
      return true;
    }
    return false;
  }

  // "key N" with 1 <= N <= max.
  std::uint64_t header(std::string_view key, std::uint64_t max) {
    std::string_view line;
    if (!next_content(line)) fail(lines_.number(), "unexpected end of file, expected '{} N'", key);
    std::size_t split = std::min(line.find_first_of(kSpace), line.size());
    if (line.substr(0, split) != key) fail(lines_.number(), "expected '{} N', got '{}'", key, quote(line));
    std::string_view text = trim(line.substr(split));
    std::uint64_t value = 0;
    if (!parse_number(text, value) || value < 1 || value > max)
      fail(lines_.number(), "{} '{}': expected an integer in [1, {}]", key, quote(text), max);
    return value;
  }

  void parse_token_line(std::string_view line, RoutingTrace& trace) {
    auto groups = static_cast<std::size_t>(std::count(line.begin(), line.end(), '|')) + 1;
    if (groups != per_layer_.size())
      fail(lines_.number(), "{} groups, expected {} (one per layer, separated by '|')", groups,
           per_layer_.size());
    std::size_t start = 0;
    for (std::size_t layer = 0; layer < groups; ++layer) {
      std::size_t bar = std::min(line.find('|', start), line.size());
      parse_group(trim(line.substr(start, bar - start)), layer, trace.experts(), per_layer_[layer]);
      start = bar + 1;
    }
    trace.add_token(per_layer_);
  }

  void parse_group(std::string_view group, std::size_t layer, int experts,
                   std::vector<RoutingChoice>& out) {
    out.clear();
    if (group == "-") return;
    if (group.empty()) fail(lines_.number(), "layer {}: empty group, expected '-' or expert:weight pairs", layer);
    while (!group.empty()) {
      std::size_t end = std::min(group.find_first_of(kSpace), group.size());
      out.push_back(parse_pair(group.substr(0, end), layer, experts));
      group = trim(group.substr(end));
      if (out.size() > static_cast<std::size_t>(top_k_))
        fail(lines_.number(), "layer {}: more than top_k {} expert:weight pairs", layer, top_k_);
      for (std::size_t j = 0; j + 1 < out.size(); ++j)
        if (out[j].expert == out.back().expert)
          fail(lines_.number(), "layer {}: expert {} appears twice, expected distinct experts",
               layer, out.back().expert);
    }
  }

  RoutingChoice parse_pair(std::string_view pair, std::size_t layer, int experts) {
    std::size_t colon = pair.find(':');
    if (colon == std::string_view::npos)
      fail(lines_.number(), "layer {}: '{}' is not an expert:weight pair", layer, quote(pair));
    std::string_view expert_text = pair.substr(0, colon), weight_text = pair.substr(colon + 1);
    RoutingChoice c{};
    if (!parse_number(expert_text, c.expert))
      fail(lines_.number(), "layer {}: bad expert '{}', expected an integer in [0, {})", layer,
           quote(expert_text), experts);
    if (c.expert >= static_cast<std::uint32_t>(experts))
      fail(lines_.number(), "layer {}: expert {} out of range [0, {})", layer, c.expert, experts);
    if (!parse_number(weight_text, c.weight) || !std::isfinite(c.weight) || !(c.weight > 0))
      fail(lines_.number(), "layer {}: bad weight '{}' of expert {}, expected a finite number > 0",
           layer, quote(weight_text), c.expert);
    return c;
  }

  std::string_view text_;
  Lines lines_;
  const std::string& origin_;
  int top_k_ = 0;
  std::vector<std::string> comments_;
  std::vector<std::vector<RoutingChoice>> per_layer_;  // reused for every token line
};

// ----------------------------------------------------------- JSON lines import

using nlohmann::json;

class JsonlImporter {
 public:
  explicit JsonlImporter(const std::string& origin) : origin_(origin) {}

  RoutingTrace run(std::string_view text) {
    Lines lines(text);
    std::string_view line;
    while (lines.next(line)) {
      if (!trim(line).empty()) add_record(line, lines.number());
    }
    if (records_ == 0) fail(lines.number(), "no routing records, expected one JSON object per line");
    return build();
  }

 private:
  struct Cell {
    std::vector<RoutingChoice> choices;
    std::size_t line = 0;  // 0: no record
  };
  struct Call {
    std::int64_t problem;
    int number;                             // forward call within the problem, from 0
    // [layer] -> token number -> cell. Sparse: with token_pos a call's
    // numbers need not start at 0 (a decode step holds one late position).
    std::vector<std::map<std::uint64_t, Cell>> layers;
    std::vector<std::size_t> records;       // per layer
    int max_layer = -1;
    bool by_position = false;  // some record numbered its token with token_pos
  };

  template <class... Args>
  [[noreturn]] void fail(std::size_t line, fmt::format_string<Args...> format, Args&&... args) {
    MOED_THROW(Input, "{}:{}: {}", origin_, line, fmt::format(format, std::forward<Args>(args)...));
  }

  static std::string shown(const json& value) {
    return quote(value.dump());
  }

  // nlohmann's message without its "[json.exception...] parse error at line 1, " prefix.
  static std::string parse_message(const json::parse_error& e) {
    std::string_view what = e.what();
    if (auto bracket = what.find("] "); bracket != std::string_view::npos) what.remove_prefix(bracket + 2);
    constexpr std::string_view kLine1 = "parse error at line 1, ";
    if (what.substr(0, kLine1.size()) == kLine1) what.remove_prefix(kLine1.size());
    return sanitize_input(what, 200);  // it quotes the bytes last read, which may be binary
  }

  // An integer in [0, limit).
  std::uint64_t index(const json& value, std::string_view what, std::uint64_t limit, std::size_t line) {
    bool ok = value.is_number_unsigned() || (value.is_number_integer() && value.get<std::int64_t>() >= 0);
    if (!ok || value.get<std::uint64_t>() >= limit)
      fail(line, "{}: expected an integer in [0, {}), got {}", what, limit, shown(value));
    return value.get<std::uint64_t>();
  }

  const json& required(const json& record, const char* key, std::size_t line) {
    auto it = record.find(key);
    if (it == record.end()) fail(line, "missing key \"{}\"", key);
    return *it;
  }

  void add_record(std::string_view text, std::size_t line) {
    json record;
    try {
      record = json::parse(text);
    } catch (const json::parse_error& e) {
      fail(line, "invalid JSON: {}", parse_message(e));
    }
    if (!record.is_object()) fail(line, "expected a JSON object, got {}", shown(record));

    auto layer = static_cast<int>(index(required(record, "layer", line), "key \"layer\"", kMaxTraceLayers, line));
    std::vector<RoutingChoice> choices = read_choices(record, line);

    std::int64_t problem = 0;
    if (auto it = record.find("problem_id"); it != record.end()) {
      if (!it->is_number_integer() ||
          (it->is_number_unsigned() && it->get<std::uint64_t>() > std::numeric_limits<std::int64_t>::max()))
        fail(line, "key \"problem_id\": expected an integer, got {}", shown(*it));
      problem = it->get<std::int64_t>();
    }
    if (auto it = record.find("dataset"); it != record.end() && !it->is_string())
      fail(line, "key \"dataset\": expected a string, got {}", shown(*it));

    Call& call = call_for(problem, layer);
    auto l = static_cast<std::size_t>(layer);
    if (call.layers.size() <= l) {
      call.layers.resize(l + 1);
      call.records.resize(l + 1, 0);
    }
    std::uint64_t token = call.records[l];  // default: running index in this (problem, call, layer)
    if (auto it = record.find("token_idx"); it != record.end()) {
      token = index(*it, "key \"token_idx\"", kMaxCallTokens, line);
    } else if (auto pos = record.find("token_pos"); pos != record.end()) {
      // The token's position: after a gap (a record lost, or a decode step's
      // single late position) the running index would name the wrong token.
      token = index(*pos, "key \"token_pos\"", kMaxCallTokens, line);
      call.by_position = true;
    }
    Cell& cell = call.layers[l][token];
    if (cell.line != 0)
      fail(line, "duplicate record for problem {}, forward call {}, layer {}, token {} (first on line {})",
           problem, call.number, layer, token, cell.line);
    cell = {std::move(choices), line};
    ++call.records[l];
    call.max_layer = std::max(call.max_layer, layer);
    max_layer_ = std::max(max_layer_, layer);
    ++records_;
  }

  std::vector<RoutingChoice> read_choices(const json& record, std::size_t line) {
    const json& experts = required(record, "experts", line);
    const json& probs = required(record, "gating_probs", line);
    if (!experts.is_array()) fail(line, "key \"experts\": expected an array, got {}", shown(experts));
    if (!probs.is_array()) fail(line, "key \"gating_probs\": expected an array, got {}", shown(probs));
    if (experts.size() != probs.size())
      fail(line, "{} experts but {} gating_probs, expected the same length", experts.size(), probs.size());
    std::vector<RoutingChoice> choices;
    for (std::size_t i = 0; i < experts.size(); ++i) {
      RoutingChoice c{};
      c.expert = static_cast<std::uint32_t>(
          index(experts[i], fmt::format("experts[{}]", i), kMaxTraceExperts, line));
      for (const auto& earlier : choices)
        if (earlier.expert == c.expert) fail(line, "experts: expert {} appears twice", c.expert);
      if (!probs[i].is_number()) fail(line, "gating_probs[{}]: expected a number, got {}", i, shown(probs[i]));
      // Stored as float: a weight that is 0 or overflows as a float cannot be replayed either.
      c.weight = static_cast<float>(probs[i].get<double>());
      if (!std::isfinite(c.weight) || !(c.weight > 0))
        fail(line, "gating_probs[{}]: expected a finite number > 0, got {}", i, shown(probs[i]));
      max_expert_ = std::max(max_expert_, c.expert);
      choices.push_back(c);
    }
    return choices;
  }

  // The problem's current forward call, or a new one when `layer` was already
  // seen in it and a higher layer came after: the layer sequence restarted.
  Call& call_for(std::int64_t problem, int layer) {
    int number = 0;
    if (auto it = current_.find(problem); it != current_.end()) {
      Call& call = calls_[it->second];
      auto l = static_cast<std::size_t>(layer);
      bool seen = l < call.records.size() && call.records[l] > 0;
      if (!seen || call.max_layer <= layer) return call;
      number = call.number + 1;
    }
    current_[problem] = calls_.size();
    calls_.push_back(Call{problem, number, {}, {}, -1, false});
    return calls_.back();
  }

  // The call's tokens in order: 0..max(token_idx) (a number without a record
  // is a token with empty cells), or with token_pos only the positions that
  // have a record (positions are not dense: a gap is not a token).
  static std::vector<std::uint64_t> token_numbers(const Call& call) {
    std::set<std::uint64_t> numbers;
    for (const auto& column : call.layers)
      for (const auto& [t, cell] : column) numbers.insert(t);
    if (call.by_position || numbers.empty()) return {numbers.begin(), numbers.end()};
    std::vector<std::uint64_t> dense(*numbers.rbegin() + 1);
    for (std::uint64_t t = 0; t < dense.size(); ++t) dense[t] = t;
    return dense;
  }

  RoutingTrace build() {
    RoutingTrace trace(max_layer_ + 1, static_cast<int>(max_expert_) + 1);
    auto layers = static_cast<std::size_t>(trace.layers());
    std::vector<std::vector<RoutingChoice>> per_layer(layers);
    std::size_t empty = 0;
    for (const Call& call : calls_) {
      for (std::uint64_t t : token_numbers(call)) {
        for (std::size_t l = 0; l < layers; ++l) {
          per_layer[l].clear();
          if (l < call.layers.size())
            if (auto it = call.layers[l].find(t); it != call.layers[l].end()) per_layer[l] = it->second.choices;
          if (per_layer[l].empty()) ++empty;
        }
        trace.add_token(per_layer);
      }
    }
    trace.comments.push_back(fmt::format("imported from {}: {} records, {} forward calls", origin_,
                                         records_, calls_.size()));
    trace.comments.push_back(fmt::format("{} of {} cells have no record ('-')", empty,
                                         trace.tokens() * layers));
    return trace;
  }

  const std::string& origin_;
  std::vector<Call> calls_;                     // in order of first appearance
  std::map<std::int64_t, std::size_t> current_;  // problem -> its current call in calls_
  int max_layer_ = -1;
  std::uint32_t max_expert_ = 0;
  std::size_t records_ = 0;
};

// "e:w e:w" for one group, '-' when empty.
void append_group(std::string& out, std::span<const RoutingChoice> group) {
  if (group.empty()) {
    out += '-';
    return;
  }
  char buffer[64];
  for (std::size_t i = 0; i < group.size(); ++i) {
    int n = std::snprintf(buffer, sizeof buffer, "%s%u:%.9g", i ? " " : "", group[i].expert,
                          static_cast<double>(group[i].weight));
    out.append(buffer, static_cast<std::size_t>(n));
  }
}

}  // namespace

RoutingTrace parse_trace(std::string_view text, const std::string& origin) {
  return TextParser(text, origin).parse();
}

RoutingTrace import_routing_jsonl(std::string_view text, const std::string& origin) {
  return JsonlImporter(origin).run(text);
}

RoutingTrace read_trace(const std::string& path) {
  MappedFile file(path);  // an Input error naming the path when missing
  std::string_view text(reinterpret_cast<const char*>(file.data()), file.size());
  auto first = text.find_first_not_of(kBlank);
  if (first != std::string_view::npos && text[first] == '{') return import_routing_jsonl(text, path);
  return parse_trace(text, path);
}

void write_trace(const RoutingTrace& trace, std::ostream& out) {
  // "tokens 0" is not valid text: the format describes recorded routing.
  MOED_CHECK(trace.tokens() > 0, "cannot write a trace without tokens");
  out << kMagic << '\n';
  for (const std::string& comment : trace.comments) {
    std::string_view rest = comment;
    while (true) {  // one '#' line per line of the comment
      std::size_t end = std::min(rest.find('\n'), rest.size());
      std::string_view part = rest.substr(0, end);
      out << (part.empty() ? "#" : "# ") << part << '\n';
      if (end == rest.size()) break;
      rest.remove_prefix(end + 1);
    }
  }
  // A trace whose groups are all empty still needs a positive top_k header.
  out << "layers " << trace.layers() << "\nexperts " << trace.experts() << "\ntop_k "
      << std::max(trace.top_k(), 1) << "\ntokens " << trace.tokens() << '\n';
  std::string line;
  for (std::size_t t = 0; t < trace.tokens(); ++t) {
    line.clear();
    for (int l = 0; l < trace.layers(); ++l) {
      if (l) line += " | ";
      append_group(line, trace.at(t, l));
    }
    line += '\n';
    out << line;
  }
}

void write_trace_file(const RoutingTrace& trace, const std::string& path) {
  std::string tmp = fmt::format("{}.tmp.{}", path, ::getpid());
  try {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) MOED_THROW(Input, "{}: cannot create {}: {}", path, tmp, std::strerror(errno));
    write_trace(trace, out);
    out.close();
    if (!out) MOED_THROW(Runtime, "{}: cannot write {}: {}", path, tmp, std::strerror(errno));
  } catch (...) {
    std::remove(tmp.c_str());
    throw;
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    int err = errno;
    std::remove(tmp.c_str());
    MOED_THROW(Runtime, "{}: cannot rename {} to it: {}", path, tmp, std::strerror(err));
  }
}

}  // namespace moed::routing
