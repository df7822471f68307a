// The router: softmax with temperature, top-k and top-p (with min/max k),
// weights renormalised, ties to the lower expert id, bit-for-bit determinism.
// Expected experts and weights are worked out by hand from the logits.
#include "runtime/router/router.h"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "common/error.h"
#include "common/rng.h"
#include "tests/unit/test_support.h"

namespace moed::runtime {
namespace {

RouterParams top_k(int k, float temperature = 1.0f) {
  RouterParams p;
  p.top_p_mode = false;
  p.top_k = k;
  p.temperature = temperature;
  return p;
}

RouterParams top_p(float mass, int min_k, int max_k) {
  RouterParams p;
  p.top_p_mode = true;
  p.top_k = max_k;
  p.top_p = mass;
  p.min_k = min_k;
  p.max_k = max_k;
  return p;
}

Routing route_one(const std::vector<float>& logits, const RouterParams& p) {
  Routing r;
  route(logits.data(), 1, logits.size(), p, r);
  return r;
}

std::vector<std::uint32_t> experts_of(const Routing& r, std::size_t t = 0) {
  auto s = r.experts_of(t);
  return {s.begin(), s.end()};
}

std::vector<float> weights_of(const Routing& r, std::size_t t = 0) {
  auto s = r.weights_of(t);
  return {s.begin(), s.end()};
}

void expect_weights(const Routing& r, const std::vector<double>& expected, std::size_t t = 0) {
  const auto w = weights_of(r, t);
  ASSERT_EQ(w.size(), expected.size());
  for (std::size_t i = 0; i < w.size(); ++i)
    EXPECT_NEAR(w[i], expected[i], 1e-6) << "weight " << i << " of token " << t;
}

std::vector<float> random_logits(std::size_t n, std::uint64_t seed, float scale = 3.0f) {
  CounterRng rng(seed);
  std::vector<float> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = scale * rng.normalish(i);
  return v;
}

// ---------------------------------------------------------------- top-k

TEST(RouterTopK, HandComputedTwoOfFour) {
  // logits {1, 3, 2, 0}: experts 1 then 2; weights e^3 / (e^3 + e^2) and e^2 / (e^3 + e^2).
  const Routing r = route_one({1, 3, 2, 0}, top_k(2));
  ASSERT_EQ(r.tokens(), 1u);
  EXPECT_EQ(experts_of(r), (std::vector<std::uint32_t>{1, 2}));
  const double e3 = std::exp(3.0), e2 = std::exp(2.0);
  expect_weights(r, {e3 / (e3 + e2), e2 / (e3 + e2)});
}

TEST(RouterTopK, TopOneHasWeightOne) {
  const Routing r = route_one({0.5f, -1, 7, 6.9f}, top_k(1));
  EXPECT_EQ(experts_of(r), (std::vector<std::uint32_t>{2}));
  EXPECT_EQ(weights_of(r), (std::vector<float>{1.0f}));
}

TEST(RouterTopK, AllExpertsChosenCoverTheWholeSoftmax) {
  // k = experts: the weights are the plain softmax, in descending order.
  const Routing r = route_one({0, 1, 2}, top_k(3));
  EXPECT_EQ(experts_of(r), (std::vector<std::uint32_t>{2, 1, 0}));
  const double s = 1 + std::exp(1.0) + std::exp(2.0);
  expect_weights(r, {std::exp(2.0) / s, std::exp(1.0) / s, 1 / s});
}

class RouterTemperature : public ::testing::TestWithParam<float> {};

TEST_P(RouterTemperature, ChangesWeightsNotOrder) {
  const float T = GetParam();
  const Routing r = route_one({1, 3, 2, 0}, top_k(2, T));
  EXPECT_EQ(experts_of(r), (std::vector<std::uint32_t>{1, 2}));
  // e^(3/T) / (e^(3/T) + e^(2/T)) = 1 / (1 + e^(-1/T)).
  const double first = 1 / (1 + std::exp(-1.0 / T));
  expect_weights(r, {first, 1 - first});
}

INSTANTIATE_TEST_SUITE_P(Temperatures, RouterTemperature, ::testing::Values(0.25f, 0.5f, 1.0f, 2.0f, 10.0f));

TEST(RouterTopK, HigherTemperatureFlattensTheWeights) {
  const float cold = weights_of(route_one({1, 3, 2, 0}, top_k(2, 0.5f)))[0];
  const float warm = weights_of(route_one({1, 3, 2, 0}, top_k(2, 4.0f)))[0];
  EXPECT_GT(cold, warm);
  EXPECT_GT(warm, 0.5f);
}

struct TieCase {
  const char* name;
  std::vector<float> logits;
  int k;
  std::vector<std::uint32_t> experts;
};

class RouterTies : public ::testing::TestWithParam<TieCase> {};

TEST_P(RouterTies, GoToTheLowerExpertId) {
  const Routing r = route_one(GetParam().logits, top_k(GetParam().k));
  EXPECT_EQ(experts_of(r), GetParam().experts);
}

INSTANTIATE_TEST_SUITE_P(
    Cases, RouterTies,
    ::testing::Values(TieCase{"AllEqual", {2, 2, 2, 2}, 2, {0, 1}},
                      TieCase{"TieForFirst", {0, 5, 5, 5, 1}, 2, {1, 2}},
                      TieCase{"TieAtTheCut", {9, 1, 1, 1}, 2, {0, 1}},
                      TieCase{"TieAtTheEnd", {1, 4, 0, 4, 4}, 3, {1, 3, 4}},
                      TieCase{"NegativeTies", {-3, -3, -7, -3}, 2, {0, 1}}),
    [](const auto& info) { return std::string(info.param.name); });

TEST(RouterTopK, EqualLogitsShareTheWeightEqually) {
  const Routing r = route_one({0, 5, 5, 5, 1}, top_k(2));
  EXPECT_EQ(weights_of(r), (std::vector<float>{0.5f, 0.5f}));
}

TEST(RouterTopK, RowsAreInDescendingProbability) {
  const Routing r = route_one({0.5f, -1, 4, 2, 3}, top_k(4));
  EXPECT_EQ(experts_of(r), (std::vector<std::uint32_t>{2, 4, 3, 0}));
  const auto w = weights_of(r);
  for (std::size_t i = 1; i < w.size(); ++i) EXPECT_GE(w[i - 1], w[i]);
}

TEST(RouterTopK, ManyTokensAgreeWithAPlainLoop) {
  // An independent selection: repeatedly take the largest remaining logit (lowest id on ties).
  const std::size_t T = 200, E = 16;
  const int k = 4;
  const std::vector<float> logits = random_logits(T * E, 11);
  Routing r;
  route(logits.data(), T, E, top_k(k), r);
  ASSERT_EQ(r.tokens(), T);
  ASSERT_EQ(r.pairs(), T * k);
  for (std::size_t t = 0; t < T; ++t) {
    const float* l = logits.data() + t * E;
    std::vector<bool> used(E, false);
    std::vector<std::uint32_t> expected;
    double denom = 0;
    for (int i = 0; i < k; ++i) {
      std::size_t best = E;
      for (std::size_t e = 0; e < E; ++e)
        if (!used[e] && (best == E || l[e] > l[best])) best = e;
      used[best] = true;
      expected.push_back(std::uint32_t(best));
      denom += std::exp(double(l[best]) - double(l[expected[0]]));
    }
    ASSERT_EQ(experts_of(r, t), expected) << "token " << t;
    double sum = 0;
    for (int i = 0; i < k; ++i) {
      const double want = std::exp(double(l[expected[i]]) - double(l[expected[0]])) / denom;
      EXPECT_NEAR(r.weights_of(t)[i], want, 1e-6) << "token " << t << " pair " << i;
      sum += r.weights_of(t)[i];
    }
    EXPECT_NEAR(sum, 1.0, 1e-6) << "token " << t;
  }
}

TEST(RouterTopK, TopKLargerThanExpertsIsAnInternalError) {
  Routing r;
  const std::vector<float> logits{1, 2, 3};
  test::expect_error([&] { route(logits.data(), 1, 3, top_k(4), r); }, ErrorKind::Internal,
                     {"top_k"});
}

// ---------------------------------------------------------------- top-p

// Logits ln(p) give softmax probabilities p: {0.5, 0.3, 0.15, 0.05} here, over experts
// listed in a shuffled order so that the id order and the probability order differ.
const std::vector<float> kProbLogits = {float(std::log(0.15)), float(std::log(0.5)),
                                        float(std::log(0.05)), float(std::log(0.3))};
// By probability: expert 1 (0.5), 3 (0.3), 0 (0.15), 2 (0.05).

struct TopPCase {
  const char* name;
  float mass;
  int min_k, max_k;
  std::vector<std::uint32_t> experts;
  std::vector<double> probs;  // of the chosen experts, renormalised in the test
};

class RouterTopP : public ::testing::TestWithParam<TopPCase> {};

TEST_P(RouterTopP, FewestExpertsReachingTheMassWithinBounds) {
  const auto& c = GetParam();
  const Routing r = route_one(kProbLogits, top_p(c.mass, c.min_k, c.max_k));
  EXPECT_EQ(experts_of(r), c.experts);
  double sum = 0;
  for (double p : c.probs) sum += p;
  std::vector<double> expected;
  for (double p : c.probs) expected.push_back(p / sum);
  expect_weights(r, expected);
}

INSTANTIATE_TEST_SUITE_P(
    Cases, RouterTopP,
    ::testing::Values(
        // 0.5 < 0.7 <= 0.8: two experts.
        TopPCase{"ReachesAtTwo", 0.7f, 1, 4, {1, 3}, {0.5, 0.3}},
        // 0.5 >= 0.45: the top expert alone.
        TopPCase{"ReachesAtOne", 0.45f, 1, 4, {1}, {0.5}},
        // 0.8 < 0.9 <= 0.95: three.
        TopPCase{"ReachesAtThree", 0.9f, 1, 4, {1, 3, 0}, {0.5, 0.3, 0.15}},
        // The mass is reached by one, but at least min_k = 2 are taken.
        TopPCase{"MinKRaisesTheCount", 0.45f, 2, 4, {1, 3}, {0.5, 0.3}},
        TopPCase{"MinKEqualsMaxK", 0.1f, 3, 3, {1, 3, 0}, {0.5, 0.3, 0.15}},
        // 0.95 < 0.99 would need all four, but max_k = 3 caps it.
        TopPCase{"MaxKCapsTheCount", 0.99f, 1, 3, {1, 3, 0}, {0.5, 0.3, 0.15}},
        TopPCase{"MaxKOfOne", 0.99f, 1, 1, {1}, {0.5}},
        TopPCase{"WholeMassTakesAll", 1.0f, 1, 4, {1, 3, 0, 2}, {0.5, 0.3, 0.15, 0.05}}),
    [](const auto& info) { return std::string(info.param.name); });

TEST(RouterTopP, TokensGetDifferentCountsInOneBatch) {
  // A peaked token needs one expert, a flat one needs three, for the same top_p.
  const std::vector<float> logits = {10, 0, 0, 0,   // ~1.0 on expert 0
                                     1, 1, 1, 1};   // 0.25 each
  Routing r;
  route(logits.data(), 2, 4, top_p(0.7f, 1, 4), r);
  ASSERT_EQ(r.tokens(), 2u);
  EXPECT_EQ(experts_of(r, 0), (std::vector<std::uint32_t>{0}));
  EXPECT_EQ(experts_of(r, 1), (std::vector<std::uint32_t>{0, 1, 2}));
  EXPECT_EQ(r.offsets, (std::vector<std::uint32_t>{0, 1, 4}));
  expect_weights(r, {1.0 / 3, 1.0 / 3, 1.0 / 3}, 1);
}

// ---------------------------------------------------------------- determinism, batching

void expect_identical(const Routing& a, const Routing& b) {
  ASSERT_EQ(a.offsets, b.offsets);
  ASSERT_EQ(a.experts, b.experts);
  ASSERT_EQ(a.weights.size(), b.weights.size());
  for (std::size_t i = 0; i < a.weights.size(); ++i)
    EXPECT_EQ(std::bit_cast<std::uint32_t>(a.weights[i]), std::bit_cast<std::uint32_t>(b.weights[i]))
        << "pair " << i;
}

TEST(RouterDeterminism, SameInputSameBits) {
  const std::size_t T = 64, E = 32;
  const std::vector<float> logits = random_logits(T * E, 5);
  for (const RouterParams& p : {top_k(8, 0.7f), top_p(0.8f, 2, 6)}) {
    Routing a, b;
    route(logits.data(), T, E, p, a);
    route(logits.data(), T, E, p, b);
    expect_identical(a, b);
  }
}

TEST(RouterDeterminism, ATokensChoiceDependsOnItsLogitsAlone) {
  // Routing the tokens one at a time gives the bits of routing them as a batch.
  const std::size_t T = 40, E = 8;
  const std::vector<float> logits = random_logits(T * E, 9);
  for (const RouterParams& p : {top_k(2), top_p(0.6f, 1, 4)}) {
    Routing batch, single;
    route(logits.data(), T, E, p, batch);
    for (std::size_t t = 0; t < T; ++t) route(logits.data() + t * E, 1, E, p, single);
    expect_identical(batch, single);
  }
}

TEST(RouterBatching, TokensAreAppendedInOrder) {
  const std::size_t E = 6;
  const std::vector<float> first = random_logits(3 * E, 1), second = random_logits(2 * E, 2);
  Routing a, b, both;
  route(first.data(), 3, E, top_k(2), a);
  route(second.data(), 2, E, top_k(2), b);
  route(first.data(), 3, E, top_k(2), both);
  route(second.data(), 2, E, top_k(2), both);
  ASSERT_EQ(both.tokens(), 5u);
  EXPECT_EQ(both.offsets, (std::vector<std::uint32_t>{0, 2, 4, 6, 8, 10}));
  for (std::size_t t = 0; t < 3; ++t) EXPECT_EQ(experts_of(both, t), experts_of(a, t));
  for (std::size_t t = 0; t < 2; ++t) {
    EXPECT_EQ(experts_of(both, 3 + t), experts_of(b, t));
    EXPECT_EQ(weights_of(both, 3 + t), weights_of(b, t));
  }
}

TEST(RouterBatching, ZeroTokensAppendNothing) {
  Routing r;
  const float dummy = 0;
  route(&dummy, 0, 4, top_k(2), r);
  EXPECT_EQ(r.tokens(), 0u);
  EXPECT_EQ(r.offsets, (std::vector<std::uint32_t>{0}));
}

// ---------------------------------------------------------------- RouterParams::from

TEST(RouterParamsFrom, TakesEveryKey) {
  Config c = default_config();
  c.model.top_k = 3;
  c.router.mode = RouterMode::topp;
  c.router.temperature = 0.5;
  c.router.top_p = 0.9;
  c.router.min_k = 2;
  c.router.max_k = 5;
  const RouterParams p = RouterParams::from(c);
  EXPECT_TRUE(p.top_p_mode);
  EXPECT_EQ(p.top_k, 3);
  EXPECT_EQ(p.temperature, 0.5f);
  EXPECT_EQ(p.top_p, 0.9f);
  EXPECT_EQ(p.min_k, 2);
  EXPECT_EQ(p.max_k, 5);
}

TEST(RouterParamsFrom, MaxKZeroMeansTopK) {
  Config c = default_config();
  c.model.top_k = 3;
  c.router.max_k = 0;
  const RouterParams p = RouterParams::from(c);
  EXPECT_FALSE(p.top_p_mode);
  EXPECT_EQ(p.max_k, 3);
}

TEST(RouterParamsFrom, DefaultsAreTopKMode) {
  const RouterParams p = RouterParams::from(default_config());
  EXPECT_FALSE(p.top_p_mode);
  EXPECT_EQ(p.top_k, 2);
  EXPECT_EQ(p.temperature, 1.0f);
  EXPECT_EQ(p.min_k, 1);
  EXPECT_EQ(p.max_k, 2);
}

}  // namespace
}  // namespace moed::runtime
