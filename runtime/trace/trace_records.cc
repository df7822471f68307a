#include "runtime/trace/trace_records.h"

#include <cstring>
#include <type_traits>

#include "common/error.h"

namespace moed::runtime::trace {

namespace {

template <class T>
void put(std::vector<std::byte>& out, const std::vector<T>& items) {
  static_assert(std::is_trivially_copyable_v<T>);
  const std::size_t at = out.size();
  out.resize(at + items.size() * sizeof(T));
  if (!items.empty()) std::memcpy(out.data() + at, items.data(), items.size() * sizeof(T));
}

template <class T>
void take(const std::byte*& at, const std::byte* end, std::uint64_t n, const char* what, std::vector<T>& out) {
  MOED_CHECK(n <= std::uint64_t(end - at) / sizeof(T), "{}: {} records of {} bytes announced, {} bytes left", what, n,
             sizeof(T), end - at);
  const std::size_t first = out.size();
  out.resize(first + n);
  if (n) std::memcpy(static_cast<void*>(out.data() + first), at, n * sizeof(T));
  at += n * sizeof(T);
}

template <class T>
void append_all(std::vector<T>& to, const std::vector<T>& from) {
  to.insert(to.end(), from.begin(), from.end());
}

}  // namespace

void TraceFragments::clear() {
  homes.clear();
  choices.clear();
  legs.clear();
  visits.clear();
}

void TraceFragments::append(const TraceFragments& other) {
  append_all(homes, other.homes);
  append_all(choices, other.choices);
  append_all(legs, other.legs);
  append_all(visits, other.visits);
}

std::vector<std::byte> encode_fragments(const TraceFragments& f) {
  std::vector<std::byte> out;
  if (f.empty()) return out;
  const std::uint64_t counts[4] = {f.homes.size(), f.choices.size(), f.legs.size(), f.visits.size()};
  out.resize(sizeof counts);
  std::memcpy(out.data(), counts, sizeof counts);
  put(out, f.homes);
  put(out, f.choices);
  put(out, f.legs);
  put(out, f.visits);
  return out;
}

void decode_fragments(const std::byte* bytes, std::size_t size, const char* what, TraceFragments& out) {
  if (size == 0) return;
  std::uint64_t counts[4];
  MOED_CHECK(size >= sizeof counts, "{}: {} bytes, less than the counts", what, size);
  std::memcpy(counts, bytes, sizeof counts);
  const std::byte *at = bytes + sizeof counts, *end = bytes + size;
  take(at, end, counts[0], what, out.homes);
  take(at, end, counts[1], what, out.choices);
  take(at, end, counts[2], what, out.legs);
  take(at, end, counts[3], what, out.visits);
  MOED_CHECK(at == end, "{}: {} bytes left over after the records", what, end - at);
}

}  // namespace moed::runtime::trace
