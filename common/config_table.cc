#include "common/config_table.h"

#include <algorithm>
#include <cmath>
#include <mutex>
#include <set>
#include <sstream>

#include "common/error.h"
#include "common/log.h"
#include "common/quote.h"

namespace moed::config::detail {
namespace {

// " (at demo.toml:12)" when the node came from a file, "" otherwise.
std::string location(const toml::node& node) {
  const auto& src = node.source();
  if (!src.path || src.begin.line == 0) return "";
  return fmt::format(" (at {}:{})", *src.path, src.begin.line);
}

const char* type_name(ValueType t) {
  switch (t) {
    case ValueType::Integer: return "an integer";
    case ValueType::Real: return "a number";
    case ValueType::Boolean: return "true or false";
    case ValueType::Text: return "a string";
  }
  return "?";
}

std::string node_text(const toml::node& node) {
  if (auto s = node.value_exact<std::string>()) return "string " + quote_input(*s);
  if (auto i = node.value_exact<std::int64_t>()) return fmt::format("integer {}", *i);
  if (auto d = node.value_exact<double>()) return fmt::format("number {}", *d);
  if (auto b = node.value_exact<bool>()) return fmt::format("boolean {}", *b);
  if (node.is_table()) return "a table";
  if (node.is_array()) return "an array";
  return "a date or time";
}

std::string format_number(double v) {
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  if (v == std::floor(v) && std::abs(v) < 1e15) return fmt::format("{}", static_cast<long long>(v));
  return fmt::format("{}", v);  // shortest form that reads back to the same double
}

// A TOML float: the shortest round-trip form, with ".0" where it would read as an integer.
std::string toml_float(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  std::string s = fmt::format("{}", v);
  if (s.find_first_of(".e") == std::string::npos) s += ".0";
  return s;
}

std::string toml_string(const std::string& v) {
  std::string out = "\"";
  for (char c : v) {
    if (c == '"' || c == '\\') out += '\\', out += c;
    else if (c == '\n') out += "\\n";
    else if (c == '\t') out += "\\t";
    else if (static_cast<unsigned char>(c) < 0x20) out += fmt::format("\\u{:04X}", int(c));
    else out += c;
  }
  return out + "\"";
}

// Levenshtein distance, for "did you mean".
size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diag = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diag = up;
    }
  }
  return row[b.size()];
}

std::string suggestion(const std::string& name, const std::vector<std::string>& known) {
  std::string best;
  size_t best_d = 3;  // suggest only close names
  for (const auto& k : known) {
    size_t d = edit_distance(name, k);
    if (d < best_d) best_d = d, best = k;
  }
  return best.empty() ? "" : fmt::format(" (did you mean '{}'?)", best);
}

std::string join(const std::vector<std::string>& items, const char* sep) {
  std::string out;
  for (size_t i = 0; i < items.size(); ++i) out += (i ? sep : "") + items[i];
  return out;
}

}  // namespace

ValueType type_of(const Value& v) { return static_cast<ValueType>(v.index()); }

Value read_value(const toml::node& node, ValueType type, double min, double max,
                 const std::vector<std::string>& choices, const std::string& where) {
  auto wrong_type = [&]() {
    MOED_THROW(Usage, "config: {} must be {}, got {}{}", where, type_name(type), node_text(node),
               location(node));
  };
  // `shown`: the value as the user wrote it (an int64 near its limits has no
  // exact double, and 9223372036854775807 must not read 9.223372036854776e+18).
  auto check_range = [&](double v, const std::string& shown) {
    if (v < min || v > max || std::isnan(v))
      MOED_THROW(Usage, "config: {} = {} is out of range: allowed {}{}", where, shown,
                 describe_allowed(type, min, max, choices), location(node));
  };
  switch (type) {
    case ValueType::Integer: {
      if (!node.is_integer()) wrong_type();
      std::int64_t v = *node.value<std::int64_t>();
      check_range(double(v), std::to_string(v));
      return v;
    }
    case ValueType::Real: {
      if (!node.is_number()) wrong_type();
      double v = *node.value<double>();
      check_range(v, format_number(v));
      return v;
    }
    case ValueType::Boolean:
      if (!node.is_boolean()) wrong_type();
      return *node.value<bool>();
    case ValueType::Text: {
      if (!node.is_string()) wrong_type();
      std::string v = *node.value<std::string>();
      if (!choices.empty() && std::find(choices.begin(), choices.end(), v) == choices.end())
        MOED_THROW(Usage, "config: {} = {} is not allowed: {}{}", where, quote_input(v),
                   describe_allowed(type, min, max, choices), location(node));
      return v;
    }
  }
  MOED_THROW(Internal, "config: unknown value type for {}", where);
}

std::string format_value(const Value& v) {
  switch (type_of(v)) {
    case ValueType::Integer: return std::to_string(std::get<std::int64_t>(v));
    case ValueType::Real: return toml_float(std::get<double>(v));
    case ValueType::Boolean: return std::get<bool>(v) ? "true" : "false";
    case ValueType::Text: return toml_string(std::get<std::string>(v));
  }
  return "?";
}

std::string describe_allowed(ValueType type, double min, double max,
                             const std::vector<std::string>& choices) {
  switch (type) {
    case ValueType::Integer:
    case ValueType::Real: {
      const char* what = type == ValueType::Integer ? "integer" : "number";
      // An integer bound beyond 2^62 means "no bound" in practice.
      bool has_min = !std::isinf(min) && std::abs(min) < 0x1p62;
      bool has_max = !std::isinf(max) && std::abs(max) < 0x1p62;
      if (has_min && has_max)
        return fmt::format("{} from {} to {}", what, format_number(min), format_number(max));
      if (has_min) return fmt::format("{} >= {}", what, format_number(min));
      if (has_max) return fmt::format("{} <= {}", what, format_number(max));
      return what;
    }
    case ValueType::Boolean: return "true or false";
    case ValueType::Text: {
      if (choices.empty()) return "string";
      std::vector<std::string> quoted;
      for (const auto& c : choices) quoted.push_back("\"" + c + "\"");
      return "one of " + join(quoted, ", ");
    }
  }
  return "?";
}

void unknown_key(const std::string& section, const std::string& key,
                 const std::vector<std::string>& known, const toml::node& where) {
  MOED_THROW(Usage, "config: unknown key [{}].{}{}{}; keys of [{}]: {}", section, sanitize_input(key),
             suggestion(key, known), location(where), section, join(known, ", "));
}

void check_key_names(const std::string& section, const std::vector<std::string>& names) {
  for (std::size_t i = 0; i < names.size(); ++i)
    for (std::size_t j = 0; j < i; ++j)
      MOED_CHECK(names[i] != names[j], "config: [{}] declares the key name {} twice", section, names[i]);
}

void renamed_key_read(const std::string& section, const std::string& old_name, const std::string& name) {
  static std::mutex mutex;
  static std::set<std::string> warned;
  std::lock_guard lock(mutex);
  if (warned.insert(section + "." + old_name).second)
    spdlog::warn("config: [{}].{} is deprecated: the key is now [{}].{}", section, old_name, section, name);
}

void key_given_twice(const std::string& section, const std::string& name, const std::string& old_name,
                     const toml::node& where) {
  MOED_THROW(Usage, "config: [{}].{} and [{}].{} are one key (its former name and its name){}: keep [{}].{}",
             section, old_name, section, name, location(where), section, name);
}

void unknown_section(const std::string& name, const std::string& origin,
                     const std::vector<std::string>& known) {
  MOED_THROW(Usage, "config: unknown section [{}] in {}{}; sections: {}", sanitize_input(name), origin,
             suggestion(name, known), join(known, ", "));
}

void not_a_table(const std::string& name, const std::string& origin) {
  MOED_THROW(Usage,
             "config: '{}' in {} is not a section: every key belongs to a section, e.g. "
             "[model] layers = 4",
             sanitize_input(name), origin);
}

void print_comment(std::ostream& os, const std::string& doc, const std::string& allowed,
                   const Value& fallback) {
  os << "# " << doc << " (" << allowed << "; default " << format_value(fallback) << ")\n";
}

Assignment parse_assignment(const std::string& text) {
  auto eq = text.find('=');
  auto dot = text.find('.');
  if (eq == std::string::npos || dot == std::string::npos || dot > eq || dot == 0 || dot + 1 == eq)
    MOED_THROW(Usage, "--set expects section.key=value, got {}", quote_input(text));
  Assignment a;
  a.section = text.substr(0, dot);
  a.key = text.substr(dot + 1, eq - dot - 1);
  std::string value = text.substr(eq + 1);
  try {
    a.holder = toml::parse("v = " + value);
    if (a.holder.size() != 1) throw std::runtime_error("more than one value");
  } catch (const std::exception&) {
    a.holder = toml::table{};
    a.holder.insert("v", value);  // a bare word: take it as a string
  }
  return a;
}

toml::table parse_toml(const std::string& text, const std::string& origin) {
  try {
    return toml::parse(text, origin);
  } catch (const toml::parse_error& err) {
    MOED_THROW(Usage, "config: {}:{}:{}: {}", origin, err.source().begin.line,
               err.source().begin.column, err.description());
  }
}

}  // namespace moed::config::detail
