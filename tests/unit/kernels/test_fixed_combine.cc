// The fixed-point combine: exact rounding of each term, order and grouping
// independence (which a float sum lacks), saturation, and the residual add.
#include "kernels/cpu/fixed_combine.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <numeric>
#include <vector>

#include "common/error.h"
#include "common/rng.h"
#include "kernels/cpu/fixed_order_gemm.h"

namespace moed::kernels {
namespace {

constexpr std::int64_t k2p32 = std::int64_t(1) << 32;
constexpr std::int64_t k2p62 = std::int64_t(1) << 62;

struct TermCase {
  float weight, y;
  std::int64_t acc_before, acc_after;
};

void PrintTo(const TermCase& c, std::ostream* os) {
  *os << "w " << c.weight << " y " << c.y << " acc " << c.acc_before;
}

class AddWeightedFixed : public ::testing::TestWithParam<TermCase> {};

// acc += round_half_even(double(w) * double(y) * 2^32).
TEST_P(AddWeightedFixed, RoundsTheExactProductOnce) {
  const auto c = GetParam();
  std::int64_t acc = c.acc_before;
  EXPECT_EQ(add_weighted_fixed(&acc, &c.y, c.weight, 1), 0u);
  EXPECT_EQ(acc, c.acc_after);
}

INSTANTIATE_TEST_SUITE_P(
    HandComputed, AddWeightedFixed,
    ::testing::Values(
        TermCase{1.0f, 1.0f, 0, k2p32},
        TermCase{0.5f, 3.0f, 0, 3 * (k2p32 / 2)},
        TermCase{-2.0f, 0.25f, 0, -(k2p32 / 2)},
        TermCase{1.0f, 1.0f, 100, 100 + k2p32},  // adds to what is there
        // Products of exactly k + 1/2 grid steps round to the even neighbour.
        TermCase{1.0f, 0x1p-33f, 0, 0},          // 0.5 -> 0
        TermCase{1.0f, 3 * 0x1p-33f, 0, 2},      // 1.5 -> 2
        TermCase{1.0f, 5 * 0x1p-33f, 0, 2},      // 2.5 -> 2
        TermCase{1.0f, -3 * 0x1p-33f, 0, -2},    // -1.5 -> -2
        TermCase{0.5f, 0x1p-32f, 0, 0},          // 0.5 -> 0
        TermCase{0.75f, 0x1p-31f, 0, 2},         // 1.5 -> 2
        TermCase{3.0f, 0x1p-34f, 0, 1},          // 0.75 -> 1
        // (1 + 2^-23)(1 - 2^-24) = 1 + 2^-24 - 2^-47: x 2^32 = 2^32 + 256 - 2^-15 -> 2^32 + 256.
        // A float product would round to 1 first and give 2^32.
        TermCase{1.0f + 0x1p-23f, 1.0f - 0x1p-24f, 0, k2p32 + 256}));

TEST(AddWeightedFixed, SaturatesBeyondTwoToThe62AndCountsIt) {
  // 2^30 in value is 2^62 on the grid: beyond it a term clamps to +-2^62.
  const std::vector<float> y = {1.0f, 0x1p31f, 0.5f, -0x1p40f, 0x1p30f - 64.0f};
  std::vector<std::int64_t> acc(y.size(), 0);
  EXPECT_EQ(add_weighted_fixed(acc.data(), y.data(), 1.0f, y.size()), 2u);
  const std::vector<std::int64_t> want = {k2p32, k2p62, k2p32 / 2, -k2p62,
                                          k2p62 - (std::int64_t(1) << 38)};  // the last fits
  // The weight counts too: 2^29 x 4 is beyond the range.
  std::int64_t one = 0;
  const float big = 0x1p29f;
  EXPECT_EQ(add_weighted_fixed(&one, &big, 4.0f, 1), 1u);
  EXPECT_EQ(one, k2p62);
}

// A NaN or inf term is no saturation to clamp: it poisons its element, which
// stays poisoned whatever is added, in any order, and is NaN in the residual.
TEST(FixedCombine, NonFiniteTermsGiveNanNotZero) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  const std::vector<float> y = {nan, -inf, inf, 1.0f, 0.0f};
  std::vector<std::int64_t> acc(y.size(), 5);
  EXPECT_EQ(add_weighted_fixed(acc.data(), y.data(), 1.0f, y.size()), 0u) << "not counted as saturation";
  EXPECT_EQ(acc, (std::vector<std::int64_t>{kFixedNaN, kFixedNaN, kFixedNaN, k2p32 + 5, 5}));
  // A finite term after a poisoned one, and a non-finite weight (0 x inf is NaN too).
  EXPECT_EQ(add_weighted_fixed(acc.data(), y.data() + 3, 2.0f, 1), 0u);
  EXPECT_EQ(acc[0], kFixedNaN);
  std::vector<std::int64_t> w(2, 0);
  const std::vector<float> ones = {1.0f, inf};
  add_weighted_fixed(w.data(), ones.data(), nan, 1);
  add_weighted_fixed(w.data() + 1, ones.data() + 1, 0.0f, 1);
  EXPECT_EQ(w, (std::vector<std::int64_t>{kFixedNaN, kFixedNaN}));
  // Partial sums: poisoned on either side.
  std::vector<std::int64_t> a = {kFixedNaN, 3, kFixedNaN}, p = {4, kFixedNaN, kFixedNaN};
  add_fixed(a.data(), p.data(), a.size());
  EXPECT_EQ(a, (std::vector<std::int64_t>(3, kFixedNaN)));
  // The residual: NaN where poisoned, the finite sum elsewhere.
  const std::vector<float> x = {1.0f, 2.0f};
  const std::vector<std::int64_t> sums = {kFixedNaN, k2p32};
  std::vector<float> out(2);
  residual_from_fixed(x.data(), sums.data(), 2, out.data());
  EXPECT_TRUE(std::isnan(out[0]));
  EXPECT_EQ(out[1], 3.0f);
}

TEST(AddFixed, AddsElementwise) {
  std::vector<std::int64_t> acc = {1, -5, k2p62}, part = {2, 5, -k2p62};
  add_fixed(acc.data(), part.data(), acc.size());
  EXPECT_EQ(acc, (std::vector<std::int64_t>{3, 0, 0}));
}

// The same 8 weighted rows summed in different orders and groupings.
TEST(FixedCombine, SumIsIndependentOfOrderAndGrouping) {
  const std::size_t h = 64, terms = 8;
  std::size_t float_orders_differing = 0;
  for (std::uint64_t seed = 1; seed <= 5; ++seed) {
    CounterRng g(seed);
    std::vector<float> y(terms * h), w(terms);
    for (std::size_t t = 0; t < terms; ++t) {
      w[t] = 0.05f + g.uniform(10'000 + t);
      // Mixed magnitudes make fp32 addition visibly non-associative.
      const float scale = std::pow(10.0f, float(t % 4) - 1.0f);
      for (std::size_t i = 0; i < h; ++i) y[t * h + i] = g.normalish(t * h + i) * scale;
    }

    std::vector<std::vector<std::size_t>> orders;
    std::vector<std::size_t> order(terms);
    std::iota(order.begin(), order.end(), 0);
    orders.push_back(order);
    orders.push_back({7, 6, 5, 4, 3, 2, 1, 0});
    Rng shuffle(seed * 77);
    for (int n = 0; n < 4; ++n) {
      for (std::size_t i = terms - 1; i > 0; --i) std::swap(order[i], order[shuffle.below(i + 1)]);
      orders.push_back(order);
    }

    std::vector<std::int64_t> reference(h, 0);
    for (std::size_t t = 0; t < terms; ++t) add_weighted_fixed(reference.data(), &y[t * h], w[t], h);
    std::vector<float> float_reference(h, 0.0f);
    for (std::size_t t = 0; t < terms; ++t)
      for (std::size_t i = 0; i < h; ++i) float_reference[i] += w[t] * y[t * h + i];

    for (const auto& o : orders) {
      std::vector<std::int64_t> acc(h, 0);
      std::vector<float> facc(h, 0.0f);
      for (std::size_t t : o) {
        EXPECT_EQ(add_weighted_fixed(acc.data(), &y[t * h], w[t], h), 0u);
        for (std::size_t i = 0; i < h; ++i) facc[i] += w[t] * y[t * h + i];
      }
      EXPECT_EQ(acc, reference) << "seed " << seed;
      float_orders_differing += std::memcmp(facc.data(), float_reference.data(), h * 4) != 0;
    }

    // Partial sums formed per "rank", then added together in different orders.
    const std::vector<std::vector<std::vector<std::size_t>>> groupings = {
        {{0, 1, 2, 3}, {4, 5, 6, 7}},
        {{0, 2, 4, 6}, {1, 3, 5, 7}},
        {{6, 7}, {0}, {1, 2, 3, 4, 5}},
        {{5}, {3, 1}, {7, 0, 2}, {6, 4}}};
    for (const auto& groups : groupings) {
      std::vector<std::int64_t> total(h, 0);
      for (const auto& group : groups) {
        std::vector<std::int64_t> partial(h, 0);
        for (std::size_t t : group) add_weighted_fixed(partial.data(), &y[t * h], w[t], h);
        add_fixed(total.data(), partial.data(), h);
      }
      EXPECT_EQ(total, reference) << "seed " << seed;
    }
  }
  // The contrast: the same terms summed in fp32 in those orders. Whether the bits
  // differ depends on the data, so this is reported, not asserted.
  std::printf("fp32 sums differing from the in-order sum: %zu of %d orders\n",
              float_orders_differing, 5 * 6);
}

struct ResidualCase {
  float x;
  std::int64_t acc;
  float want;
};

void PrintTo(const ResidualCase& c, std::ostream* os) { *os << "x " << c.x << " acc " << c.acc; }

class ResidualFromFixed : public ::testing::TestWithParam<ResidualCase> {};

// out = fp32(x + acc * 2^-32), rounded once.
TEST_P(ResidualFromFixed, AddsAndRoundsOnce) {
  const auto c = GetParam();
  float out = -123.0f;
  residual_from_fixed(&c.x, &c.acc, 1, &out);
  EXPECT_EQ(out, c.want) << "x " << c.x << " acc " << c.acc;
}

INSTANTIATE_TEST_SUITE_P(
    HandComputed, ResidualFromFixed,
    ::testing::Values(ResidualCase{1.0f, k2p32, 2.0f}, ResidualCase{0.0f, 3 * (k2p32 / 2), 1.5f},
                      ResidualCase{0.5f, -k2p32, -0.5f}, ResidualCase{-1.0f, 0, -1.0f},
                      ResidualCase{0.0f, 1, 0x1p-32f},
                      // 1 + 2^-24 is halfway between 1 and 1 + 2^-23: ties to even (1).
                      ResidualCase{1.0f, 256, 1.0f},
                      // Just above halfway rounds up.
                      ResidualCase{1.0f, 257, 1.0f + 0x1p-23f},
                      // 1 + 3*2^-24: halfway between 1 + 2^-23 (odd) and 1 + 2^-22 (even).
                      ResidualCase{1.0f, 768, 1.0f + 0x1p-22f},
                      ResidualCase{1e6f, -(std::int64_t(1000000) << 32), 0.0f}));

// The vector loop (with the widest kernels, where the CPU has AVX-512 DQ)
// gives the scalar loop's integers and saturation count, with every kind of
// term in a group of eight: in range, ties, saturated, inf, NaN, and
// accumulators already poisoned; at lengths with and without a tail.
TEST(AddWeightedFixed, EveryInstructionSetGivesThePortableSums) {
  CounterRng g(31);
  std::vector<float> y;
  std::vector<std::int64_t> acc;
  for (int i = 0; i < 4099; ++i) {
    y.push_back(g.symmetric(2 * i) * (i % 11 == 0 ? 1e3f : 2.0f));
    acc.push_back(std::int64_t(g.bits(2 * i + 1) >> 8) - (std::int64_t(1) << 55));
  }
  // Exact halves of the grid (ties to even), huge terms, non-finite terms.
  y[5] = 0x1p-33f, y[6] = 3 * 0x1p-33f, y[7] = -0x1p-33f;
  y[40] = 3e30f, y[41] = -3e30f, y[80] = std::numeric_limits<float>::infinity();
  y[81] = std::numeric_limits<float>::quiet_NaN(), acc[120] = kFixedNaN;
  const GemmIsa before = gemm_isa();
  int tried = 0;
  for (float weight : {0.75f, -1.0f, 0.3f}) {
    set_gemm_isa(GemmIsa::portable);
    std::vector<std::int64_t> want = acc;
    const std::size_t want_saturated = add_weighted_fixed(want.data(), y.data(), weight, y.size());
    for (GemmIsa isa : {GemmIsa::avx2, GemmIsa::avx512}) {
      if (best_gemm_isa() < isa) continue;  // this CPU cannot run it
      set_gemm_isa(isa);
      ++tried;
      for (std::size_t n : {y.size(), std::size_t(8), std::size_t(13), std::size_t(130)}) {
        std::vector<std::int64_t> got(acc.begin(), acc.begin() + std::ptrdiff_t(n));
        const std::size_t saturated = add_weighted_fixed(got.data(), y.data(), weight, n);
        std::vector<std::int64_t> expected(acc.begin(), acc.begin() + std::ptrdiff_t(n));
        set_gemm_isa(GemmIsa::portable);
        EXPECT_EQ(saturated, add_weighted_fixed(expected.data(), y.data(), weight, n)) << to_string(isa) << " n " << n;
        set_gemm_isa(isa);
        ASSERT_EQ(got, expected) << to_string(isa) << " weight " << weight << " n " << n;
      }
    }
    EXPECT_GT(want_saturated, 0u);  // the case holds saturated terms
  }
  set_gemm_isa(before);
  if (tried == 0) GTEST_SKIP() << "no vector instruction set here";
}

// ---------------------------------------------------------------- narrow rows

struct WidthCase {
  std::vector<std::int64_t> values;
  int width;
};

void PrintTo(const WidthCase& c, std::ostream* os) {
  *os << c.values.size() << " values, width " << c.width;
  for (std::int64_t v : c.values) *os << " " << v;
}

class FixedWidthBytes : public ::testing::TestWithParam<WidthCase> {};

// The fewest bytes of two's complement that hold every value.
TEST_P(FixedWidthBytes, IsTheFewestBytesThatHoldEveryValue) {
  EXPECT_EQ(fixed_width_bytes(GetParam().values.data(), GetParam().values.size()), GetParam().width);
}

constexpr std::int64_t k2p39 = std::int64_t(1) << 39;

INSTANTIATE_TEST_SUITE_P(
    Boundaries, FixedWidthBytes,
    ::testing::Values(WidthCase{{}, 1}, WidthCase{{0}, 1}, WidthCase{{127, -128}, 1}, WidthCase{{128}, 2},
                      WidthCase{{-129}, 2}, WidthCase{{0, 0, -1, 32767}, 2}, WidthCase{{32768}, 3},
                      WidthCase{{k2p39 - 1, -k2p39}, 5}, WidthCase{{k2p39}, 6}, WidthCase{{1, -k2p39 - 1}, 6},
                      WidthCase{{k2p32}, 5}, WidthCase{{std::numeric_limits<std::int64_t>::max()}, 8},
                      WidthCase{{3, kFixedNaN, 4}, 8}, WidthCase{{(std::int64_t(1) << 55) - 1}, 7}));

// Rows of every width, narrowed in place and added back: the same integers as
// add_fixed of the full-width row, the NaN rule included.
TEST(NarrowFixed, InPlaceRoundTripAddsTheSameIntegersAtEveryWidth) {
  Rng g(41);
  for (int width = 1; width <= 8; ++width) {
    for (std::size_t h : {std::size_t(1), std::size_t(7), std::size_t(64), std::size_t(2049)}) {
      const int bits = 8 * width;
      std::vector<std::int64_t> row(h);
      for (std::size_t i = 0; i < h; ++i) {  // uniform over the width's range, ends included
        const std::uint64_t raw = g.next();
        row[i] = bits == 64 ? std::int64_t(raw) : std::int64_t(raw << (64 - bits)) >> (64 - bits);
      }
      row[0] = width == 8 ? std::numeric_limits<std::int64_t>::min() + 1 : -(std::int64_t(1) << (bits - 1));
      if (h > 1) row[h - 1] = width == 8 ? std::numeric_limits<std::int64_t>::max() : (std::int64_t(1) << (bits - 1)) - 1;
      ASSERT_EQ(fixed_width_bytes(row.data(), h), width) << "h " << h;
      std::vector<std::int64_t> want(h), acc(h);
      for (std::size_t i = 0; i < h; ++i) want[i] = acc[i] = std::int64_t(g.next() >> 2) - (std::int64_t(1) << 61);
      acc[h / 2] = want[h / 2] = kFixedNaN;  // stays poisoned
      add_fixed(want.data(), row.data(), h);

      std::vector<std::byte> bytes(h * 8);
      std::memcpy(bytes.data(), row.data(), h * 8);
      narrow_fixed(bytes.data(), h, width, bytes.data());
      add_narrow_fixed(acc.data(), bytes.data(), width, h);
      ASSERT_EQ(acc, want) << "width " << width << " h " << h;
      // Into a separate buffer, and from its tail towards its front, the same bytes.
      std::vector<std::byte> apart(h * width), shifted(h * 8 + 24);
      std::memcpy(shifted.data() + 24, row.data(), h * 8);
      narrow_fixed(shifted.data() + 24, h, width, shifted.data());
      std::memcpy(bytes.data(), row.data(), h * 8);
      narrow_fixed(bytes.data(), h, width, apart.data());
      EXPECT_EQ(std::memcmp(apart.data(), shifted.data(), h * width), 0) << "width " << width << " h " << h;
    }
  }
}

TEST(NarrowFixed, PoisonedSumsTravelAtFullWidth) {
  const std::vector<std::int64_t> row = {5, kFixedNaN, -5};
  ASSERT_EQ(fixed_width_bytes(row.data(), row.size()), 8);
  std::vector<std::int64_t> acc = {1, 2, kFixedNaN};
  add_narrow_fixed(acc.data(), reinterpret_cast<const std::byte*>(row.data()), 8, row.size());
  EXPECT_EQ(acc, (std::vector<std::int64_t>{6, kFixedNaN, kFixedNaN}));
}

TEST(NarrowFixed, RefusesAWidthOutsideOneToEight) {
  std::int64_t acc = 0;
  const std::byte in[16] = {};
  for (int width : {0, 9, -1}) {
    EXPECT_THROW(add_narrow_fixed(&acc, in, width, 1), Error) << width;
    std::byte out[16];
    EXPECT_THROW(narrow_fixed(in, 1, width, out), Error) << width;
  }
}

}  // namespace
}  // namespace moed::kernels
