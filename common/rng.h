// Counter-based random numbers: value i of stream `key` is a pure function of
// (key, i), so any rank can produce any element (a weight, a token) without
// generating what comes before it, and every run gives the same bits.
#pragma once

#include <cstdint>
#include <string_view>

namespace moed {

// splitmix64's finalizer: a bijective mix of 64 bits.
constexpr std::uint64_t mix64(std::uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

constexpr std::uint64_t hash_combine(std::uint64_t a, std::uint64_t b) {
  return mix64(a ^ mix64(b + 0x632BE59BD9B4E019ull));
}

// FNV-1a, to derive stream keys from names (e.g. tensor names).
constexpr std::uint64_t hash_name(std::string_view s) {
  std::uint64_t h = 0xCBF29CE484222325ull;
  for (char c : s) h = (h ^ static_cast<unsigned char>(c)) * 0x100000001B3ull;
  return h;
}

class CounterRng {
 public:
  explicit constexpr CounterRng(std::uint64_t key) : key_(mix64(key)) {}

  constexpr std::uint64_t bits(std::uint64_t i) const { return mix64(key_ ^ mix64(i)); }
  // Uniform in [0, 1) with 24 random bits: exact in float.
  float uniform(std::uint64_t i) const { return float(bits(i) >> 40) * 0x1.0p-24f; }
  // Uniform in [-1, 1): mean 0, variance 1/3.
  float symmetric(std::uint64_t i) const { return uniform(i) * 2.0f - 1.0f; }
  // Irwin-Hall sum of four uniforms, centred and scaled: mean 0, variance 1,
  // close to normal and free of libm, so identical on every machine.
  float normalish(std::uint64_t i) const {
    std::uint64_t b = bits(i);
    float s = 0;
    // Through int32 (the same value): vector units convert 32-bit integers.
    for (int j = 0; j < 4; ++j) s += float(std::int32_t((b >> (16 * j)) & 0xFFFF)) * 0x1.0p-16f;
    return (s - 2.0f) * 1.7320508f;  // sqrt(12/4)
  }

 private:
  std::uint64_t key_;
};

// A sequential stream over a CounterRng, for code that draws in order.
class Rng {
 public:
  explicit constexpr Rng(std::uint64_t key) : gen_(key) {}
  std::uint64_t next() { return gen_.bits(counter_++); }
  float uniform() { return gen_.uniform(counter_++); }
  float normalish() { return gen_.normalish(counter_++); }
  // Uniform integer in [0, n) (n > 0), by 128-bit multiply (Lemire), without modulo bias worth
  // caring about at our n.
  std::uint64_t below(std::uint64_t n) {
    return static_cast<std::uint64_t>((static_cast<unsigned __int128>(next()) * n) >> 64);
  }

 private:
  CounterRng gen_;
  std::uint64_t counter_ = 0;
};

}  // namespace moed
