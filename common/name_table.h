// NameTable: the names of an enum's values, as configs and command lines
// spell them. One table reads a name (TOML, --set, a flag, an admin request)
// into the value and gives the value's name back (--print-config, messages,
// JSON), so that code compares enum values and a typo does not compile.
#pragma once

#include <array>
#include <cstddef>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

namespace moed::config {

namespace detail {
[[noreturn]] void value_outside_table(std::size_t value, std::size_t size);
[[noreturn]] void unknown_name(std::string_view name, const std::string& where,
                               const std::vector<std::string>& names);
}  // namespace detail

// One value of the enum E and the name configs and command lines spell it with.
template <class E>
struct Named {
  E value;
  std::string_view name;
};

// The names of an enum's values, in the enum's order (the order the allowed
// values are listed). Made by name_table(), which checks it as it compiles.
template <class E, std::size_t N>
struct NameTable {
  std::array<Named<E>, N> entries;

  // A value cast from outside the table is an Internal error.
  std::string_view name(E value) const {
    const auto i = static_cast<std::size_t>(value);
    if (i >= N) detail::value_outside_table(i, N);
    return entries[i].name;
  }
  constexpr std::optional<E> find(std::string_view name) const {
    for (const auto& e : entries)
      if (e.name == name) return e.value;
    return std::nullopt;
  }
  // An unknown name is a Usage error: "WHERE = "NAME" is not allowed: one of ...".
  E parse(std::string_view name, const std::string& where) const {
    if (auto value = find(name)) return *value;
    detail::unknown_name(name, where, names());
  }
  std::vector<std::string> names() const {
    std::vector<std::string> out;
    for (const auto& e : entries) out.emplace_back(e.name);
    return out;
  }
};

// name_table<E>({{E::a, "a"}, {E::b, "b"}}): the entries must be the values
// 0, 1, ... in order, each with its own non-empty name, or it does not compile
// (a value appended to the enum without a name is caught only when printed).
template <class E, std::size_t N>
consteval NameTable<E, N> name_table(const Named<E> (&entries)[N]) {
  static_assert(std::is_enum_v<E>);
  NameTable<E, N> table{};
  for (std::size_t i = 0; i < N; ++i) {
    if (static_cast<std::size_t>(entries[i].value) != i) throw "name_table: list every value once, in enum order";
    if (entries[i].name.empty()) throw "name_table: a value without a name";
    for (std::size_t j = 0; j < i; ++j)
      if (entries[j].name == entries[i].name) throw "name_table: two values with one name";
    table.entries[i] = entries[i];
  }
  return table;
}

}  // namespace moed::config
