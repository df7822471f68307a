// Config tables in the manner of UCX: every key is declared once, next to the
// struct field it fills, with its default, its allowed values and a one-line
// doc. A part of moed declares one Section for its own struct; the daemon
// composes the sections into a Schema that loads TOML, applies `--set`
// overrides and prints the effective config with the docs as comments.
//
// Every refusal is a Usage error naming the key ("[model].top_k") and what is
// allowed, so the daemon can exit with code 2 before it touches anything.
//
// A key with a fixed set of values is an enum class in its struct, read and
// printed through the enum's NameTable (common/name_table.h); a renamed key
// keeps its old names as aliases (renamed_from), still read, never printed.
#pragma once

#include <toml++/toml.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <limits>
#include <ostream>
#include <string>
#include <type_traits>
#include <variant>
#include <vector>

#include "common/name_table.h"

namespace moed::config {

using Value = std::variant<std::int64_t, double, bool, std::string>;
enum class ValueType { Integer, Real, Boolean, Text };

// An enum field of S, read and written by name (the Value is its name).
template <class S>
struct ChoiceField {
  std::function<std::string(const S&)> get;
  std::function<void(S&, const std::string&)> set;
};

// One key: a field of the section struct S plus everything needed to check it.
template <class S>
struct Key {
  using Field = std::variant<std::int64_t S::*, double S::*, bool S::*, std::string S::*, ChoiceField<S>>;
  std::string name;
  std::string doc;
  Field field;
  Value fallback;  // the default
  double min = -std::numeric_limits<double>::infinity();
  double max = std::numeric_limits<double>::infinity();
  std::vector<std::string> choices;  // for text keys; empty means any string
  std::vector<std::string> aliases;  // former names, still read (see renamed_from)

  // The key was called `old_name`: TOML and --set still take it (logged as
  // deprecated, once per process); --print-config and the list of a section's
  // keys give only the new name.
  Key renamed_from(std::string old_name) && {
    aliases.push_back(std::move(old_name));
    return std::move(*this);
  }
};

template <class S>
Key<S> integer(std::string name, std::int64_t S::*field, std::int64_t fallback, std::int64_t min,
               std::int64_t max, std::string doc) {
  return {std::move(name), std::move(doc), field, fallback, double(min), double(max), {}, {}};
}
template <class S>
Key<S> real(std::string name, double S::*field, double fallback, double min, double max,
            std::string doc) {
  return {std::move(name), std::move(doc), field, fallback, min, max, {}, {}};
}
template <class S>
Key<S> flag(std::string name, bool S::*field, bool fallback, std::string doc) {
  return {std::move(name), std::move(doc), field, fallback, 0, 0, {}, {}};
}
template <class S>
Key<S> text(std::string name, std::string S::*field, std::string fallback, std::string doc) {
  return {std::move(name), std::move(doc), field, std::move(fallback), 0, 0, {}, {}};
}
template <class S>
Key<S> choice(std::string name, std::string S::*field, std::string fallback,
              std::vector<std::string> choices, std::string doc) {
  return {std::move(name), std::move(doc), field, std::move(fallback), 0, 0, std::move(choices), {}};
}
// An enum key: its values are the names of `names`, its default `fallback`.
template <class S, class E, std::size_t N>
Key<S> choice(std::string name, E S::*field, E fallback, const NameTable<E, N>& names, std::string doc) {
  ChoiceField<S> access{[field, names](const S& s) { return std::string(names.name(s.*field)); },
                        [field, names, name](S& s, const std::string& v) { s.*field = names.parse(v, name); }};
  return {std::move(name), std::move(doc), std::move(access), std::string(names.name(fallback)), 0, 0, names.names(),
          {}};
}

// The untyped core shared by every Section (config_table.cc).
namespace detail {
ValueType type_of(const Value& v);
// Reads `node` as a value of `type` and checks range and choices; `where` is
// the qualified key name for messages, e.g. "[router].top_p".
Value read_value(const toml::node& node, ValueType type, double min, double max,
                 const std::vector<std::string>& choices, const std::string& where);
std::string format_value(const Value& v);      // as TOML
std::string describe_allowed(ValueType type, double min, double max,
                             const std::vector<std::string>& choices);
[[noreturn]] void unknown_key(const std::string& section, const std::string& key,
                              const std::vector<std::string>& known, const toml::node& where);
// Each name and former name of a section's keys is used once (an Internal error otherwise).
void check_key_names(const std::string& section, const std::vector<std::string>& names);
// The warning, once per process, that [section].old_name is now [section].name.
void renamed_key_read(const std::string& section, const std::string& old_name, const std::string& name);
[[noreturn]] void key_given_twice(const std::string& section, const std::string& name,
                                  const std::string& old_name, const toml::node& where);
void print_comment(std::ostream& os, const std::string& doc, const std::string& allowed,
                   const Value& fallback);
[[noreturn]] void unknown_section(const std::string& name, const std::string& origin,
                                  const std::vector<std::string>& known);
[[noreturn]] void not_a_table(const std::string& name, const std::string& origin);
// "section.key=value" split, with value parsed as TOML (a bare word becomes a string).
struct Assignment {
  std::string section, key;
  toml::table holder;  // owns the parsed value under the key "v"
};
Assignment parse_assignment(const std::string& text);
// Parses TOML text; a syntax error becomes a Usage error "origin:line:col: ...".
toml::table parse_toml(const std::string& text, const std::string& origin);
}  // namespace detail

template <class S>
class Section {
 public:
  Section(std::string name, std::string doc, std::vector<Key<S>> keys)
      : name_(std::move(name)), doc_(std::move(doc)), keys_(std::move(keys)) {
    std::vector<std::string> names;
    for (const auto& k : keys_) {
      names.push_back(k.name);
      names.insert(names.end(), k.aliases.begin(), k.aliases.end());
    }
    detail::check_key_names(name_, names);
  }

  const std::string& name() const { return name_; }
  const std::string& doc() const { return doc_; }
  const std::vector<Key<S>>& keys() const { return keys_; }

  S defaults() const {
    S s{};
    for (const auto& k : keys_) assign(s, k, k.fallback);
    return s;
  }

  // Every key of `table` must be declared; each is type-, range- and choice-checked.
  // A key given under its name and a former name is refused (which would win?).
  void load(const toml::table& table, S& out) const {
    for (const auto& k : keys_)
      for (const auto& old_name : k.aliases)
        if (table.contains(old_name) && table.contains(k.name))
          detail::key_given_twice(name_, k.name, old_name, *table.get(old_name));
    for (const auto& [key, node] : table) set(out, std::string(key.str()), node);
  }

  void set(S& out, const std::string& key, const toml::node& node) const {
    const Key<S>& k = find(key, node);
    assign(out, k,
           detail::read_value(node, detail::type_of(k.fallback), k.min, k.max, k.choices,
                              "[" + name_ + "]." + key));
  }

  void print(std::ostream& os, const S& values) const {
    os << "\n[" << name_ << "]  # " << doc_ << "\n";
    for (const auto& k : keys_) {
      detail::print_comment(
          os, k.doc, detail::describe_allowed(detail::type_of(k.fallback), k.min, k.max, k.choices),
          k.fallback);
      os << k.name << " = " << detail::format_value(get(values, k)) << "\n";
    }
  }

  Value get(const S& s, const Key<S>& k) const {
    return std::visit(
        [&](const auto& field) -> Value {
          if constexpr (std::is_same_v<std::decay_t<decltype(field)>, ChoiceField<S>>) return field.get(s);
          else return s.*field;
        },
        k.field);
  }

 private:
  const Key<S>& find(const std::string& key, const toml::node& node) const {
    for (const auto& k : keys_)
      if (k.name == key) return k;
    for (const auto& k : keys_)
      for (const auto& old_name : k.aliases)
        if (old_name == key) {
          detail::renamed_key_read(name_, old_name, k.name);
          return k;
        }
    std::vector<std::string> known;
    for (const auto& k : keys_) known.push_back(k.name);
    detail::unknown_key(name_, key, known, node);
  }

  static void assign(S& s, const Key<S>& k, const Value& v) {
    std::visit(
        [&](const auto& field) {
          if constexpr (std::is_same_v<std::decay_t<decltype(field)>, ChoiceField<S>>) {
            field.set(s, std::get<std::string>(v));
          } else {
            using T = std::remove_reference_t<decltype(s.*field)>;
            s.*field = std::get<T>(v);
          }
        },
        k.field);
  }

  std::string name_;
  std::string doc_;
  std::vector<Key<S>> keys_;
};

// The whole config of a program: sections bound to members of Root.
template <class Root>
class Schema {
 public:
  template <class S>
  void add(const Section<S>& section, S Root::*member) {
    sections_.push_back(Bound{
        section.name(),
        [&section, member](Root& r) { r.*member = section.defaults(); },
        [&section, member](const toml::table& t, Root& r) { section.load(t, r.*member); },
        [&section, member](Root& r, const std::string& key, const toml::node& n) {
          section.set(r.*member, key, n);
        },
        [&section, member](std::ostream& os, const Root& r) { section.print(os, r.*member); }});
  }

  Root defaults() const {
    Root r{};
    for (const auto& s : sections_) s.reset(r);
    return r;
  }

  // Overlays a parsed TOML document on `r`. `origin` names it in messages.
  void load(const toml::table& doc, Root& r, const std::string& origin) const {
    for (const auto& [name, node] : doc) {
      if (!node.is_table()) detail::not_a_table(std::string(name.str()), origin);
      find(std::string(name.str()), origin).load(*node.as_table(), r);
    }
  }

  // "section.key=value"; the value is read as TOML, or as a bare string.
  void set(Root& r, const std::string& assignment) const;

  void print(std::ostream& os, const Root& r) const {
    for (const auto& s : sections_) s.print(os, r);
  }

  std::vector<std::string> section_names() const {
    std::vector<std::string> names;
    for (const auto& s : sections_) names.push_back(s.name);
    return names;
  }

 private:
  struct Bound {
    std::string name;
    std::function<void(Root&)> reset;
    std::function<void(const toml::table&, Root&)> load;
    std::function<void(Root&, const std::string&, const toml::node&)> set;
    std::function<void(std::ostream&, const Root&)> print;
  };

  const Bound& find(const std::string& name, const std::string& origin) const {
    for (const auto& s : sections_)
      if (s.name == name) return s;
    detail::unknown_section(name, origin, section_names());
  }

  std::vector<Bound> sections_;
};

template <class Root>
void Schema<Root>::set(Root& r, const std::string& assignment) const {
  detail::Assignment a = detail::parse_assignment(assignment);
  find(a.section, "--set").set(r, a.key, *a.holder.get("v"));
}

}  // namespace moed::config
