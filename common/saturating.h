// Sizes that saturate at the largest uint64 instead of wrapping: products of
// shape keys near their limits overflow 64 bits, and a wrapped size would
// pass a memory check it should fail.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <limits>

namespace moed {

inline constexpr std::uint64_t kSaturated = std::numeric_limits<std::uint64_t>::max();

inline std::uint64_t saturating_mul(std::initializer_list<std::uint64_t> factors) {
  std::uint64_t out = 1;
  for (std::uint64_t f : factors)
    if (__builtin_mul_overflow(out, f, &out)) return kSaturated;
  return out;
}
inline std::uint64_t saturating_mul(std::uint64_t a, std::uint64_t b) { return saturating_mul({a, b}); }
inline std::uint64_t saturating_add(std::uint64_t a, std::uint64_t b) { return a > kSaturated - b ? kSaturated : a + b; }

}  // namespace moed
