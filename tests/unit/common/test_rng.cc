// Counter-based RNG: a pure function of (key, index); the distributions it
// derives; the sequential Rng; FNV-1a name hashing.
#include "common/rng.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace moed {
namespace {

TEST(CounterRng, IsAPureFunctionOfKeyAndIndex) {
  CounterRng a(42), b(42);
  // Drawing in a different order, from a different instance, gives the same bits.
  std::vector<std::uint64_t> forward(100);
  for (std::uint64_t i = 0; i < 100; ++i) forward[i] = a.bits(i);
  for (std::uint64_t i = 100; i-- > 0;) EXPECT_EQ(b.bits(i), forward[i]) << "index " << i;
  EXPECT_EQ(a.bits(1ull << 63), b.bits(1ull << 63));
  // Indices of one stream differ from each other.
  for (std::uint64_t i = 1; i < 100; ++i) EXPECT_NE(forward[i], forward[i - 1]);
}

TEST(CounterRng, DifferentKeysGiveDifferentStreams) {
  CounterRng a(1), b(2), c(0);
  for (std::uint64_t i = 0; i < 1000; ++i) {
    EXPECT_NE(a.bits(i), b.bits(i)) << "index " << i;
    EXPECT_NE(a.bits(i), c.bits(i)) << "index " << i;
  }
  // Not just a shifted copy of the same stream.
  EXPECT_NE(a.bits(1), b.bits(0));
}

TEST(CounterRng, UniformIsInUnitIntervalOnA24BitGrid) {
  CounterRng g(7);
  double sum = 0;
  float lo = 1, hi = 0;
  const int n = 100000;
  for (int i = 0; i < n; ++i) {
    float u = g.uniform(std::uint64_t(i));
    ASSERT_GE(u, 0.0f);
    ASSERT_LT(u, 1.0f);
    // A multiple of 2^-24: exact in float, with no rounding up to 1.
    double scaled = double(u) * 0x1p24;
    ASSERT_EQ(scaled, std::floor(scaled)) << u;
    sum += u;
    lo = std::min(lo, u);
    hi = std::max(hi, u);
  }
  EXPECT_NEAR(sum / n, 0.5, 0.01);
  EXPECT_LT(lo, 0.001f);
  EXPECT_GT(hi, 0.999f);
}

TEST(CounterRng, SymmetricIsInMinusOneToOne) {
  CounterRng g(8);
  double sum = 0, sq = 0;
  const int n = 100000;
  for (int i = 0; i < n; ++i) {
    float s = g.symmetric(std::uint64_t(i));
    ASSERT_GE(s, -1.0f);
    ASSERT_LT(s, 1.0f);
    sum += s;
    sq += double(s) * s;
  }
  EXPECT_NEAR(sum / n, 0.0, 0.01);
  EXPECT_NEAR(sq / n, 1.0 / 3.0, 0.01);
}

TEST(CounterRng, NormalishHasMeanZeroAndVarianceOne) {
  CounterRng g(9);
  const int n = 100000;
  double sum = 0, sq = 0;
  for (int i = 0; i < n; ++i) {
    double x = g.normalish(std::uint64_t(i));
    // Irwin-Hall of 4 uniforms scaled by sqrt(3): bounded by 2 sqrt(3).
    ASSERT_LE(std::abs(x), 2 * std::sqrt(3.0) + 1e-6);
    sum += x;
    sq += x * x;
  }
  double mean = sum / n;
  EXPECT_NEAR(mean, 0.0, 0.02);
  EXPECT_NEAR(sq / n - mean * mean, 1.0, 0.02);
}

TEST(Rng, SequentialStreamReadsTheCounterStream) {
  Rng r(123);
  CounterRng c(123);
  for (std::uint64_t i = 0; i < 50; ++i) EXPECT_EQ(r.next(), c.bits(i));
  // uniform() and normalish() take the next index too.
  EXPECT_EQ(r.uniform(), c.uniform(50));
  EXPECT_EQ(r.normalish(), c.normalish(51));
}

class RngBelow : public ::testing::TestWithParam<std::uint64_t> {};

TEST_P(RngBelow, StaysBelowNAndIsRoughlyUniform) {
  const std::uint64_t n = GetParam();
  const int draws = 100000;
  Rng r(1000 + n);
  std::vector<int> count(n, 0);
  for (int i = 0; i < draws; ++i) {
    std::uint64_t v = r.below(n);
    ASSERT_LT(v, n);
    ++count[v];
  }
  // Chi-square with n-1 degrees of freedom: mean n-1, sd sqrt(2(n-1)). Allow
  // mean + 6 sd: a fair generator essentially never exceeds it.
  double expected = double(draws) / double(n), chi2 = 0;
  for (int c : count) chi2 += (c - expected) * (c - expected) / expected;
  double dof = double(n - 1);
  EXPECT_LE(chi2, dof + 6 * std::sqrt(2 * dof) + 1e-9) << "n = " << n;
}

INSTANTIATE_TEST_SUITE_P(Sizes, RngBelow, ::testing::Values(1, 2, 3, 7, 10, 64, 1000));

// FNV-1a written out from its definition (64-bit offset basis and prime).
std::uint64_t fnv1a(std::string_view s) {
  std::uint64_t h = 14695981039346656037ull;
  for (unsigned char c : s) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return h;
}

TEST(HashName, IsFnv1a) {
  // Published FNV-1a 64-bit test vectors.
  EXPECT_EQ(hash_name(""), 0xcbf29ce484222325ull);
  EXPECT_EQ(hash_name("a"), 0xaf63dc4c8601ec8cull);
  EXPECT_EQ(hash_name("foobar"), 0x85944171f73967e8ull);
  for (std::string name : std::vector<std::string>{"model.layers.0.block_sparse_moe.experts.3.w1.weight", "router",
                           std::string("\xff\x80 high bytes")})
    EXPECT_EQ(hash_name(name), fnv1a(name)) << name;
  // Usable at compile time, for constant stream keys.
  static_assert(hash_name("a") == 0xaf63dc4c8601ec8cull);
}

}  // namespace
}  // namespace moed
