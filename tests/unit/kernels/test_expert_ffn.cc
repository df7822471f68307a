// The SwiGLU expert: fast_exp accuracy and clamping, silu_mul, the whole FFN
// against a double loop, and identical bits for identical calls.
#include "kernels/cpu/expert_ffn.h"

#include <gtest/gtest.h>

#include <bit>

#include <cmath>
#include <cstring>
#include <limits>
#include <tuple>
#include <vector>

#include "common/rng.h"
#include "kernels/cpu/fixed_combine.h"

namespace moed::kernels {
namespace {

TEST(FastExp, WithinTwoTenMillionthsOfExpOverItsRange) {
  // A dense sweep of [-87, 88] plus the end points; compared with exp in double.
  double worst = 0;
  float worst_x = 0;
  auto check = [&](float x) {
    double want = std::exp(double(x));
    double rel = std::abs(double(fast_exp(x)) - want) / want;
    if (rel > worst) worst = rel, worst_x = x;
  };
  for (int i = 0; i <= 1750000; ++i) check(-87.0f + float(i) * 1e-4f);
  for (float x : {-87.0f, 88.0f, 0.0f, -0.0f, 1e-30f, -1e-30f, 0.34657359f, -0.34657359f})
    check(x);
  EXPECT_LT(worst, 2e-7) << "worst at x = " << worst_x;
}

// Beyond the range of a normal float result, exp is 0 below and inf above
// (what std::exp gives too, less the denormals), never a wrong finite value.
TEST(FastExp, SaturatesOutsideTheRange) {
  EXPECT_GT(fast_exp(-87.0f), std::numeric_limits<float>::min());  // normal, not a denormal
  EXPECT_TRUE(std::isfinite(fast_exp(88.0f)));
  for (float x : {-87.5f, -100.0f, -1e30f, -std::numeric_limits<float>::infinity()})
    EXPECT_EQ(fast_exp(x), 0.0f) << x;
  for (float x : {88.8f, 100.0f, 1e30f, std::numeric_limits<float>::infinity()})
    EXPECT_TRUE(std::isinf(fast_exp(x))) << x;
}

TEST(SiluMul, MatchesTheDoubleFormula) {
  CounterRng g(17);
  std::vector<float> gate, up;
  for (int i = 0; i < 4000; ++i) {
    gate.push_back(g.symmetric(2 * i) * 20.0f);
    up.push_back(g.symmetric(2 * i + 1) * 3.0f);
  }
  for (float x : {0.0f, 1.0f, -1.0f, 60.0f, -60.0f, 100.0f}) gate.push_back(x), up.push_back(1.5f);
  std::vector<float> out(gate.size());
  silu_mul(gate.data(), up.data(), gate.size(), out.data());
  for (std::size_t i = 0; i < gate.size(); ++i) {
    double g_ = gate[i];
    double want = g_ / (1.0 + std::exp(-g_)) * double(up[i]);
    EXPECT_NEAR(out[i], want, 1e-6 * std::abs(want) + 1e-30) << "gate " << gate[i] << " up " << up[i];
  }
}

// Each instruction set's loop (chosen with the fixed-order GEMM's) gives the
// portable loop's bits, at every length (vector bodies and scalar tails).
TEST(SiluMul, EveryInstructionSetGivesThePortableBits) {
  CounterRng g(23);
  std::vector<float> gate, up;
  for (int i = 0; i < 5003; ++i) {
    gate.push_back(g.symmetric(2 * i) * (i % 7 == 0 ? 120.0f : 12.0f));
    up.push_back(g.symmetric(2 * i + 1) * 3.0f);
  }
  for (float x : {0.0f, -0.0f, 87.0f, -87.0f, 88.9f, -88.9f, 1e30f, -1e30f}) gate.push_back(x), up.push_back(1.5f);
  const GemmIsa before = gemm_isa();
  set_gemm_isa(GemmIsa::portable);
  std::vector<float> want(gate.size());
  silu_mul(gate.data(), up.data(), gate.size(), want.data());
  int tried = 0;
  for (GemmIsa isa : {GemmIsa::avx2, GemmIsa::avx512}) {
    if (best_gemm_isa() < isa) continue;  // this CPU cannot run it
    set_gemm_isa(isa);
    ++tried;
    for (std::size_t n : {gate.size(), std::size_t(1), std::size_t(15), std::size_t(17), std::size_t(33)}) {
      std::vector<float> out(n);
      silu_mul(gate.data(), up.data(), n, out.data());
      for (std::size_t i = 0; i < n; ++i)
        ASSERT_EQ(std::bit_cast<std::uint32_t>(out[i]), std::bit_cast<std::uint32_t>(want[i]))
            << to_string(isa) << " n " << n << " gate " << gate[i];
    }
  }
  set_gemm_isa(before);
  if (tried == 0) GTEST_SKIP() << "no vector instruction set here";
}

TEST(SiluMul, VeryNegativeGateGivesAboutZero) {
  // silu(g) = g e^g is below 1e-40 in magnitude for every g <= -100; fast_exp
  // clamps exp(-g) at exp(88), which must not turn that into g / exp(88).
  const float gate[] = {-100.0f, -1e30f, -3e38f}, up[] = {2.0f, 2.0f, 2.0f};
  float out[3];
  silu_mul(gate, up, 3, out);
  for (int i = 0; i < 3; ++i) {
    EXPECT_TRUE(std::isfinite(out[i])) << gate[i];
    EXPECT_LE(std::abs(out[i]), 1e-30f) << "gate " << gate[i];
  }
}

// A random expert with its weights, in torch layout and packed.
struct Expert {
  std::size_t H, F;
  std::vector<float> w13, w2;
  PackedWeights w13_packed, w2_packed;
  ExpertView view() const { return {&w13_packed, &w2_packed, nullptr, nullptr, H, F, 1, nullptr, nullptr, {}}; }
  ExpertView openblas_view() const { return {nullptr, nullptr, w13.data(), w2.data(), H, F, 1, nullptr, nullptr, {}}; }
};

Expert random_expert(std::size_t H, std::size_t F, std::uint64_t key) {
  CounterRng g(key);
  Expert e{H, F, std::vector<float>(2 * F * H), std::vector<float>(H * F), {}, {}};
  const float s1 = 1.0f / std::sqrt(float(H)), s2 = 1.0f / std::sqrt(float(F));
  for (std::size_t i = 0; i < e.w13.size(); ++i) e.w13[i] = g.symmetric(i) * s1 * 2;
  for (std::size_t i = 0; i < e.w2.size(); ++i) e.w2[i] = g.symmetric(1'000'000 + i) * s2;
  e.w13_packed = PackedWeights(e.w13.data(), 2 * F, H);
  e.w2_packed = PackedWeights(e.w2.data(), H, F);
  return e;
}

// y = W2 (silu(W1 x) * (W3 x)), W1 = rows [0, F) of w13, W3 = rows [F, 2F).
std::vector<double> reference_ffn(const Expert& e, const std::vector<float>& x, std::size_t m) {
  std::vector<double> y(m * e.H), act(e.F);
  for (std::size_t r = 0; r < m; ++r) {
    for (std::size_t f = 0; f < e.F; ++f) {
      double g = 0, u = 0;
      for (std::size_t h = 0; h < e.H; ++h) {
        g += double(e.w13[f * e.H + h]) * x[r * e.H + h];
        u += double(e.w13[(e.F + f) * e.H + h]) * x[r * e.H + h];
      }
      act[f] = g / (1 + std::exp(-g)) * u;
    }
    for (std::size_t h = 0; h < e.H; ++h) {
      double s = 0;
      for (std::size_t f = 0; f < e.F; ++f) s += double(e.w2[h * e.F + f]) * act[f];
      y[r * e.H + h] = s;
    }
  }
  return y;
}

std::vector<float> random_rows(std::size_t m, std::size_t H, std::uint64_t key) {
  CounterRng g(key);
  std::vector<float> x(m * H);
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = g.normalish(i);
  return x;
}

class ExpertFfn : public ::testing::TestWithParam<std::tuple<std::size_t, bool>> {};

TEST_P(ExpertFfn, MatchesADoubleLoop) {
  const auto [m, openblas] = GetParam();
  const std::size_t H = 48, F = 40;
  Expert e = random_expert(H, F, 100);
  const ExpertView view = openblas ? e.openblas_view() : e.view();
  std::vector<float> x = random_rows(m, H, 200 + m);
  std::vector<float> y(m * H), scratch(expert_ffn_scratch(view, m));
  ASSERT_EQ(scratch.size(), m * 2 * F);
  expert_ffn(view, x.data(), m, y.data(), scratch.data());
  std::vector<double> want = reference_ffn(e, x, m);
  double magnitude = 0;
  for (double v : want) magnitude = std::max(magnitude, std::abs(v));
  ASSERT_GT(magnitude, 0.1);  // the test has something to compare
  for (std::size_t i = 0; i < y.size(); ++i)
    EXPECT_NEAR(y[i], want[i], 1e-4 * magnitude) << "row " << i / H << " col " << i % H;
}

INSTANTIATE_TEST_SUITE_P(Rows, ExpertFfn,
                         ::testing::Combine(::testing::Values(1, 5, 17), ::testing::Bool()),
                         [](const auto& info) {
                           return (std::get<1>(info.param) ? "openblas_" : "fixed_order_") +
                                  std::to_string(std::get<0>(info.param));
                         });

TEST(ExpertFfn, ARowsOutputDoesNotDependOnItsBatch) {
  // The fixed-order path: one token alone, or at any position among others.
  const std::size_t H = 64, F = 96, most = 40;
  Expert e = random_expert(H, F, 400);
  const std::vector<float> others = random_rows(most, H, 401), row = random_rows(1, H, 402);
  std::vector<float> alone(H), scratch(expert_ffn_scratch(e.view(), most));
  expert_ffn(e.view(), row.data(), 1, alone.data(), scratch.data());
  for (std::size_t m : {2, 7, 13, 40})
    for (std::size_t pos : {std::size_t(0), m / 2, m - 1}) {
      std::vector<float> x(others.begin(), others.begin() + std::ptrdiff_t(m * H)), y(m * H);
      std::copy(row.begin(), row.end(), x.begin() + std::ptrdiff_t(pos * H));
      expert_ffn(e.view(), x.data(), m, y.data(), scratch.data());
      ASSERT_EQ(std::memcmp(y.data() + pos * H, alone.data(), H * sizeof(float)), 0)
          << "position " << pos << " of " << m;
    }
}

TEST(ExpertFfn, IdenticalCallsGiveIdenticalBits) {
  // Two identical calls agree bit for bit, whatever the buffers held before.
  const std::size_t m = 13, H = 64, F = 96;
  Expert e = random_expert(H, F, 300);
  std::vector<float> x = random_rows(m, H, 301);
  std::vector<float> y1(m * H, 0.0f), y2(m * H, -1.0f);
  std::vector<float> s1(expert_ffn_scratch(e.view(), m), 0.0f);
  std::vector<float> s2(s1.size(), std::numeric_limits<float>::quiet_NaN());
  expert_ffn(e.view(), x.data(), m, y1.data(), s1.data());
  expert_ffn(e.view(), x.data(), m, y2.data(), s2.data());
  EXPECT_EQ(std::memcmp(y1.data(), y2.data(), y1.size() * sizeof(float)), 0);
  for (float v : y1) ASSERT_TRUE(std::isfinite(v));
}

// Canonical F-chunks and shards (expert_ffn.h): the gate-weighted output of
// rows, chunk by chunk on the fixed grid, as the executor forms it.
std::vector<std::int64_t> fixed_terms(const ExpertView& v, const std::vector<float>& x, std::size_t m,
                                      const std::vector<float>& weights) {
  std::vector<float> h13(expert_ffn_scratch(v, m)), y(m * v.hidden);
  std::vector<std::int64_t> acc(m * v.hidden, 0);
  expert_ffn_up(v, x.data(), m, h13.data());
  for (std::size_t c = 0; c < v.chunks; ++c) {
    expert_ffn_down_chunk(v, h13.data(), m, c, y.data());
    for (std::size_t i = 0; i < m; ++i)
      add_weighted_fixed(acc.data() + i * v.hidden, y.data() + i * v.hidden, weights[i], v.hidden);
  }
  return acc;
}

// A shard's own weights, packed as a rank holding it keeps them.
struct Shard {
  std::vector<float> w13, w2;
  PackedWeights w13_packed, w2_packed;
  ExpertView view(std::size_t H, std::size_t F, std::size_t chunks) const {
    return {&w13_packed, &w2_packed, nullptr, nullptr, H, F, chunks, nullptr, nullptr, {}};
  }
};

Shard shard_of(const Expert& e, std::size_t s, std::size_t S) {
  const std::size_t width = e.F / S;
  Shard sh{std::vector<float>(2 * width * e.H), std::vector<float>(e.H * width), {}, {}};
  shard_expert_weights(e.w13.data(), e.w2.data(), e.H, e.F, s, S, sh.w13.data(), sh.w2.data());
  sh.w13_packed = PackedWeights(sh.w13.data(), 2 * width, e.H);
  sh.w2_packed = PackedWeights(sh.w2.data(), e.H, width);
  return sh;
}

class ExpertShards : public ::testing::TestWithParam<std::tuple<std::size_t, std::size_t>> {};

// The shards' integers add up to the unsharded expert's, bit for bit, for
// every split of the canonical chunks.
TEST_P(ExpertShards, SumToTheWholeExpertOnTheFixedGrid) {
  const auto [chunks, shards] = GetParam();
  const std::size_t H = 48, F = 96, m = 9;
  const Expert e = random_expert(H, F, 500);
  const std::vector<float> x = random_rows(m, H, 501);
  std::vector<float> weights(m);
  for (std::size_t i = 0; i < m; ++i) weights[i] = 0.1f + 0.07f * float(i);
  ExpertView whole = e.view();
  whole.chunks = chunks;
  const std::vector<std::int64_t> want = fixed_terms(whole, x, m, weights);
  std::vector<std::int64_t> sum(want.size(), 0);
  for (std::size_t s = 0; s < shards; ++s) {
    const Shard sh = shard_of(e, s, shards);
    const std::vector<std::int64_t> part = fixed_terms(sh.view(H, F / shards, chunks / shards), x, m, weights);
    add_fixed(sum.data(), part.data(), sum.size());
  }
  ASSERT_EQ(sum, want) << chunks << " chunks over " << shards << " shards";
  // And the chunked output is still the expert's: near the double loop.
  const std::vector<double> ref = reference_ffn(e, x, m);
  for (std::size_t i = 0; i < want.size(); ++i)
    ASSERT_NEAR(double(want[i]) / kFixedOne, double(weights[i / H]) * ref[i], 1e-4) << i;
}

INSTANTIATE_TEST_SUITE_P(ChunksAndShards, ExpertShards,
                         ::testing::Values(std::tuple{1, 1}, std::tuple{2, 1}, std::tuple{2, 2}, std::tuple{4, 2},
                                           std::tuple{4, 4}, std::tuple{8, 2}, std::tuple{8, 8}),
                         [](const auto& info) {
                           return std::to_string(std::get<0>(info.param)) + "_chunks_" +
                                  std::to_string(std::get<1>(info.param)) + "_shards";
                         });

// One chunk is today's expert: the down-projection of chunk 0 is expert_ffn's
// output bit for bit, with the fixed-order GEMM and with OpenBLAS.
TEST(ExpertFfn, OneChunkIsTheWholeDownProjection) {
  const std::size_t m = 11, H = 64, F = 96;
  const Expert e = random_expert(H, F, 600);
  const std::vector<float> x = random_rows(m, H, 601);
  for (const ExpertView& v : {e.view(), e.openblas_view()}) {
    std::vector<float> y(m * H), by_chunk(m * H), scratch(expert_ffn_scratch(v, m));
    expert_ffn(v, x.data(), m, y.data(), scratch.data());
    expert_ffn_up(v, x.data(), m, scratch.data());
    expert_ffn_down_chunk(v, scratch.data(), m, 0, by_chunk.data());
    EXPECT_EQ(std::memcmp(y.data(), by_chunk.data(), y.size() * sizeof(float)), 0) << (v.w2 ? "openblas" : "fixed");
  }
}

TEST(ExpertFfn, ShardWeightsAreTheExpertsRowsAndColumns) {
  const std::size_t H = 3, F = 4;
  std::vector<float> w13(2 * F * H), w2(H * F);
  for (std::size_t i = 0; i < w13.size(); ++i) w13[i] = float(i);
  for (std::size_t i = 0; i < w2.size(); ++i) w2[i] = 100.0f + float(i);
  std::vector<float> s13(F * H), s2(H * 2);
  shard_expert_weights(w13.data(), w2.data(), H, F, 1, 2, s13.data(), s2.data());
  // W1 rows 2, 3 then W3 rows 6, 7 (of the stacked [2F, H]); W2 columns 2, 3.
  EXPECT_EQ(s13, (std::vector<float>{6, 7, 8, 9, 10, 11, 18, 19, 20, 21, 22, 23}));
  EXPECT_EQ(s2, (std::vector<float>{102, 103, 106, 107, 110, 111}));
}

}  // namespace
}  // namespace moed::kernels

// ---------------------------------------------------------------- gpt-oss's expert
// y = W2 a + b2, a = g σ(1.702 g) (u + 1), g = min(W1 x + b1, 7),
// u = clamp(W3 x + b3, -7, 7): the formula of openai/gpt-oss's swiglu.
namespace moed::kernels {
namespace {

struct BiasedExpert {
  Expert e;
  std::vector<float> b13, b2;
  ExpertView view(bool packed) const {
    ExpertView v = packed ? e.view() : e.openblas_view();
    v.b13 = b13.data();
    v.b2 = b2.data();
    v.activation = {true, 1.702f, 7.0f};
    return v;
  }
};

BiasedExpert biased_expert(std::size_t H, std::size_t F) {
  BiasedExpert b{random_expert(H, F, 700), std::vector<float>(2 * F), std::vector<float>(H)};
  // Large enough that some gates and ups pass the clamp at 7.
  for (float& w : b.e.w13) w *= 6;
  b.e.w13_packed = PackedWeights(b.e.w13.data(), 2 * F, H);
  CounterRng g(701);
  for (std::size_t i = 0; i < b.b13.size(); ++i) b.b13[i] = g.symmetric(i);
  for (std::size_t i = 0; i < b.b2.size(); ++i) b.b2[i] = g.symmetric(10'000 + i);
  return b;
}

std::vector<double> clamped_reference(const BiasedExpert& b, const std::vector<float>& x, std::size_t m,
                                      std::size_t& clamped) {
  const Expert& e = b.e;
  std::vector<double> y(m * e.H), act(e.F);
  for (std::size_t r = 0; r < m; ++r) {
    for (std::size_t f = 0; f < e.F; ++f) {
      double g = b.b13[f], u = b.b13[e.F + f];
      for (std::size_t h = 0; h < e.H; ++h) {
        g += double(e.w13[f * e.H + h]) * x[r * e.H + h];
        u += double(e.w13[(e.F + f) * e.H + h]) * x[r * e.H + h];
      }
      clamped += (g > 7) + (std::abs(u) > 7);
      g = std::min(g, 7.0);
      u = std::clamp(u, -7.0, 7.0);
      act[f] = g / (1 + std::exp(-1.702 * g)) * (u + 1);
    }
    for (std::size_t h = 0; h < e.H; ++h) {
      double s = b.b2[h];
      for (std::size_t f = 0; f < e.F; ++f) s += double(e.w2[h * e.F + f]) * act[f];
      y[r * e.H + h] = s;
    }
  }
  return y;
}

TEST(ClampedSwiglu, WithBiasesMatchesTheDoubleFormula) {
  const std::size_t H = 48, F = 40, m = 9;
  const BiasedExpert b = biased_expert(H, F);
  const std::vector<float> x = random_rows(m, H, 702);
  std::size_t clamped = 0;
  const std::vector<double> want = clamped_reference(b, x, m, clamped);
  ASSERT_GT(clamped, 20u);  // the clamp is exercised
  double magnitude = 0;
  for (double v : want) magnitude = std::max(magnitude, std::abs(v));
  for (bool packed : {true, false}) {
    const ExpertView v = b.view(packed);
    std::vector<float> y(m * H), scratch(expert_ffn_scratch(v, m));
    expert_ffn(v, x.data(), m, y.data(), scratch.data());
    for (std::size_t i = 0; i < y.size(); ++i)
      EXPECT_NEAR(y[i], want[i], 1e-4 * magnitude) << (packed ? "packed" : "openblas") << " element " << i;
  }
}

TEST(ClampedSwiglu, ChunksAddTheDownBiasOnce) {
  // The down-projection chunk by chunk: the sum over chunks is the whole output.
  const std::size_t H = 32, F = 40, m = 3;
  const BiasedExpert b = biased_expert(H, F);
  ExpertView whole = b.view(true), chunked = whole;
  chunked.chunks = 4;
  const std::vector<float> x = random_rows(m, H, 703);
  std::vector<float> y(m * H), scratch(expert_ffn_scratch(whole, m)), part(m * H);
  expert_ffn(whole, x.data(), m, y.data(), scratch.data());
  std::vector<double> sum(m * H, 0.0);
  expert_ffn_up(chunked, x.data(), m, scratch.data());
  for (std::size_t c = 0; c < chunked.chunks; ++c) {
    expert_ffn_down_chunk(chunked, scratch.data(), m, c, part.data());
    for (std::size_t i = 0; i < sum.size(); ++i) sum[i] += part[i];
  }
  for (std::size_t i = 0; i < sum.size(); ++i) EXPECT_NEAR(sum[i], y[i], 1e-4) << "element " << i;
}

TEST(ClampedSwiglu, NanStaysNan) {
  const float gate[] = {std::nanf(""), 1.0f}, up[] = {1.0f, std::nanf("")};
  float out[2];
  clamped_swiglu(gate, up, 2, 1.702f, 7.0f, out);
  EXPECT_TRUE(std::isnan(out[0]));
  EXPECT_TRUE(std::isnan(out[1]));
}

}  // namespace
}  // namespace moed::kernels
