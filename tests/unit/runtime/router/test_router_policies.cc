// Router policies beside the load policies: the ranking with selection
// adjustments (runtime/router/router.h rank_experts), bias balancing, the jitter
// measurement's noise, the gather's records, and RouterPolicies as a whole:
// smoothing never touches a first position, and a step decided by several
// "ranks", each counting its own slice, gives each the bits of one rank.
#include "runtime/router/policies/router_policies.h"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <numeric>
#include <vector>

#include "common/rng.h"
#include "runtime/router/policies/jitter.h"
#include "tests/unit/test_support.h"

namespace moed::runtime {
namespace {

RouterParams top_k(int k) {
  RouterParams p;
  p.top_k = k;
  p.max_k = k;
  return p;
}

std::vector<float> random_logits(std::size_t n, std::uint64_t seed) {
  const CounterRng rng(seed);
  std::vector<float> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = 2 * rng.normalish(i);
  return v;
}

// ---- rank_experts --------------------------------------------------------------------------

TEST(RankExperts, WithoutAdjustmentItIsTheRouterBitForBit) {
  const std::size_t T = 64, E = 8;
  const auto logits = random_logits(T * E, 3);
  for (const RouterParams& p : {top_k(2), [] {
         RouterParams q;
         q.top_p_mode = true, q.top_p = 0.6f, q.min_k = 1, q.max_k = 3, q.top_k = 3;
         return q;
       }()}) {
    Ranked ranked;
    rank_experts(logits.data(), nullptr, T, E, p, 2, ranked);
    Routing chosen, plain;
    choose(ranked, RouterSpec{}, chosen);
    route(logits.data(), T, E, p, plain);
    EXPECT_EQ(chosen.experts, plain.experts);
    EXPECT_EQ(chosen.weights, plain.weights);
    for (std::size_t t = 0; t < T; ++t) EXPECT_EQ(ranked.experts_of(t).size(), ranked.chosen[t] + 2u) << t;
  }
}

TEST(RankExperts, AnAdjustmentChangesTheChoiceNotTheProbabilities) {
  // logits {3, 2, 1, 0}: top-2 is {0, 1}; +3.5 on expert 3 makes it {3, 0}.
  const std::vector<float> logits{3, 2, 1, 0};
  const std::vector<double> adjust{0, 0, 0, 3.5};
  Ranked ranked;
  rank_experts(logits.data(), adjust.data(), 1, 4, top_k(2), 1, ranked);
  EXPECT_EQ(std::vector<std::uint32_t>(ranked.experts.begin(), ranked.experts.end()),
            (std::vector<std::uint32_t>{3, 0, 1}));
  const double s = std::exp(3.0) + std::exp(2.0) + std::exp(1.0) + 1;
  EXPECT_DOUBLE_EQ(ranked.probs[0], 1 / s);
  EXPECT_DOUBLE_EQ(ranked.probs[1], std::exp(3.0) / s);
  Routing r;
  choose(ranked, RouterSpec{}, r);
  EXPECT_FLOAT_EQ(r.weights[0], float(1 / (1 + std::exp(3.0))));
}

TEST(RankExperts, KEqualToExpertsKeepsNoExtraCandidate) {
  const auto logits = random_logits(4 * 3, 5);
  Ranked ranked;
  rank_experts(logits.data(), nullptr, 4, 3, top_k(3), 2, ranked);
  for (std::size_t t = 0; t < 4; ++t) EXPECT_EQ(ranked.experts_of(t).size(), 3u);
}

// ---- bias balancing ------------------------------------------------------------------------

TEST(BiasBalancer, MovesEachBiasByGammaTowardTheMeanLoad) {
  BiasBalancer b(2, 4, 0.01);
  const std::vector<std::uint64_t> load{10, 2, 4, 4};  // mean 5
  b.update(1, load);
  EXPECT_EQ(std::vector<double>(b.layer(1).begin(), b.layer(1).end()), (std::vector<double>{-0.01, 0.01, 0.01, 0.01}));
  EXPECT_EQ(std::vector<double>(b.layer(0).begin(), b.layer(0).end()), (std::vector<double>(4, 0.0)));
  b.update(1, std::vector<std::uint64_t>{5, 5, 5, 5});
  EXPECT_DOUBLE_EQ(b.layer(1)[0], -0.01) << "a balanced step changes nothing";
  b.update(1, std::vector<std::uint64_t>{0, 0, 0, 0});
  EXPECT_DOUBLE_EQ(b.layer(1)[1], 0.01) << "an empty step changes nothing";
}

TEST(BiasBalancer, BalancesASkewedRouterOverSteps) {
  // Logits with a fixed favourite: expert 0 gets +1.5 on every token.
  const std::size_t T = 512, E = 8;
  auto logits = random_logits(T * E, 9);
  for (std::size_t t = 0; t < T; ++t) logits[t * E] += 1.5f;
  BiasBalancer bias(1, int(E), 0.02);
  const auto spread = [&](const std::vector<std::uint64_t>& load) {
    const double mean = double(T * 2) / double(E);
    double var = 0;
    for (std::uint64_t n : load) var += (double(n) - mean) * (double(n) - mean);
    return std::sqrt(var / double(E)) / mean;
  };
  double first = 0, last = 0;
  std::vector<double> adjust(T * E);
  for (int step = 0; step < 200; ++step) {
    for (std::size_t t = 0; t < T; ++t) std::copy_n(bias.layer(0).data(), E, adjust.data() + t * E);
    Ranked ranked;
    rank_experts(logits.data(), adjust.data(), T, E, top_k(2), 0, ranked);
    std::vector<std::uint64_t> load(E, 0);
    for (std::uint32_t e : ranked.experts) ++load[e];
    (step == 0 ? first : last) = spread(load);
    bias.update(0, load);
  }
  EXPECT_GT(first, 0.3);
  EXPECT_LT(last, 0.1) << "from " << first;
}

// ---- records and noise ---------------------------------------------------------------------

TEST(CandidateRecords, RoundTripExactly) {
  const auto logits = random_logits(5 * 6, 11);
  RouterParams p;
  p.top_p_mode = true, p.top_p = 0.5f, p.min_k = 1, p.max_k = 3, p.top_k = 3;
  Ranked ranked;
  rank_experts(logits.data(), nullptr, 5, 6, p, 1, ranked);
  std::vector<TokenTag> tags;
  for (std::uint64_t t = 0; t < 5; ++t) tags.push_back({(t << 40) + 3 * t, std::uint32_t(t * 7)});
  std::vector<std::uint32_t> words(5 * record_words(4));
  encode_records(ranked, tags, 4, words.data());
  Ranked back;
  std::vector<TokenTag> back_tags;
  decode_records(words.data(), 5, 4, 6, back, back_tags);
  EXPECT_EQ(back.offsets, ranked.offsets);
  EXPECT_EQ(back.experts, ranked.experts);
  EXPECT_EQ(back.chosen, ranked.chosen);
  for (std::size_t i = 0; i < ranked.probs.size(); ++i)
    EXPECT_EQ(std::bit_cast<std::uint64_t>(back.probs[i]), std::bit_cast<std::uint64_t>(ranked.probs[i]));
  for (std::size_t t = 0; t < 5; ++t) {
    EXPECT_EQ(back_tags[t].request, tags[t].request);
    EXPECT_EQ(back_tags[t].position, tags[t].position);
  }
  // A token without experts (a replayed trace's empty cell) travels too.
  Ranked empty;
  empty.end_token(0);
  std::vector<std::uint32_t> one(record_words(4));
  encode_records(empty, std::vector<TokenTag>{{9, 1}}, 4, one.data());
  Ranked empty_back;
  std::vector<TokenTag> empty_tags;
  decode_records(one.data(), 1, 4, 6, empty_back, empty_tags);
  EXPECT_EQ(empty_back.chosen, (std::vector<std::uint32_t>{0}));
  EXPECT_TRUE(empty_back.experts_of(0).empty());
  words[4] = 99;  // an expert out of range
  test::expect_error([&] { decode_records(words.data(), 1, 4, 6, back, back_tags); }, ErrorKind::Internal, {"expert 99"});
}

TEST(Jitter, NoiseIsRelativeAndAPureFunctionOfTheTokensKey) {
  const std::size_t H = 64;
  const auto x = random_logits(2 * H, 13);
  const std::uint64_t keys[] = {5, 6}, same_key[] = {5, 5};
  std::vector<float> a(2 * H), b(2 * H), c(2 * H);
  perturb_rows(x.data(), 2, H, keys, 1, 1e-3, a.data());
  perturb_rows(x.data(), 2, H, same_key, 1, 1e-3, b.data());
  perturb_rows(x.data(), 2, H, keys, 1, 0.0, c.data());
  EXPECT_EQ(c, x) << "eps 0 is no noise";
  double max_rel = 0;
  for (std::size_t i = 0; i < 2 * H; ++i) max_rel = std::max(max_rel, std::abs(double(a[i]) - x[i]) / std::abs(double(x[i])));
  EXPECT_LT(max_rel, 1e-3 * 4);
  EXPECT_GT(max_rel, 1e-3 * 0.5);
  for (std::size_t i = 0; i < H; ++i) EXPECT_EQ(a[i], b[i]) << "same key, same noise";
  bool differs = false;
  for (std::size_t i = 0; i < H; ++i) differs |= (b[H + i] / x[H + i]) != (b[i] / x[i]);
  EXPECT_TRUE(differs);
}

TEST(Jitter, CountsTokensWhoseSetChanged) {
  Ranked a, b;
  for (auto [r, e] : {std::pair{&a, std::vector<std::uint32_t>{1, 2, 0, 3, 4, 5}},
                      std::pair{&b, std::vector<std::uint32_t>{2, 1, 0, 4, 3, 5}}}) {
    for (std::size_t t = 0; t < 3; ++t) {
      r->experts.insert(r->experts.end(), e.begin() + std::ptrdiff_t(2 * t), e.begin() + std::ptrdiff_t(2 * t + 2));
      r->probs.insert(r->probs.end(), {0.5, 0.5});
      r->end_token(t == 2 ? 1 : 2);
    }
  }
  // token 0: {1, 2} both; token 1: {0, 3} vs {0, 4}; token 2 (one chosen): {4} vs {3}.
  EXPECT_EQ(changed_choices(a, b), 2u);
}

// ---- RouterPolicies ----------------------------------------------------------------------

Config policies_config(double beta, LoadPolicy load_policy, double gamma) {
  Config c = default_config();
  c.model.layers = 2;
  c.model.experts = 6;
  c.model.top_k = 2;
  c.router.smoothing_beta = beta;
  c.router.load_policy = load_policy;
  c.router.bias_gamma = gamma;
  c.router.capacity_factor = 1.0;
  validate_config(c);
  return c;
}

TEST(RouterPolicies, SmoothingNeverAdjustsAFirstPosition) {
  const Config c = policies_config(1.0, LoadPolicy::none, 0);
  RouterPolicies p(c, 2, 6);
  ASSERT_TRUE(p.shares_tokens());
  Ranked all;
  const std::vector<float> logits{5, 4, 0, 0, 0, 0};
  rank_experts(logits.data(), nullptr, 1, 6, top_k(2), 0, all);
  const std::vector<TokenTag> tags{{42, 0}};
  Routing mine;
  RouterCounters n;
  p.decide(0, all, tags, 0, 1, std::vector<std::uint32_t>(6, 1), mine, n);
  p.end_step();
  std::vector<double> adjust;
  const std::vector<TokenTag> next{{42, 1}, {42, 0}, {43, 1}};
  const double* a = p.adjustments(0, next, adjust);
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(std::vector<double>(a, a + 6), (std::vector<double>{1, 1, 0, 0, 0, 0})) << "position 1 of request 42";
  EXPECT_EQ(std::vector<double>(a + 6, a + 12), std::vector<double>(6, 0.0)) << "a first position";
  EXPECT_EQ(std::vector<double>(a + 12, a + 18), std::vector<double>(6, 0.0)) << "an unknown request";
  const double* other_layer = p.adjustments(1, next, adjust);
  EXPECT_EQ(std::vector<double>(other_layer, other_layer + 6), std::vector<double>(6, 0.0));
}

TEST(RouterPolicies, SmoothingKeepsANearTieWithThePreviousChoice) {
  // Position 0 prefers {0, 1}; position 1 prefers {0, 2} by a hair: the bonus keeps {0, 1}.
  const Config c = policies_config(0.1, LoadPolicy::none, 0);
  RouterPolicies p(c, 2, 6);
  const std::vector<float> first{3, 2, 1.99f, 0, 0, 0}, second{3, 1.99f, 2, 0, 0, 0};
  Ranked all;
  rank_experts(first.data(), nullptr, 1, 6, top_k(2), 0, all);
  Routing mine;
  RouterCounters n;
  p.decide(0, all, std::vector<TokenTag>{{1, 0}}, 0, 1, std::vector<std::uint32_t>(6, 1), mine, n);
  p.end_step();
  std::vector<double> adjust;
  Ranked smoothed, plain;
  rank_experts(second.data(), p.adjustments(0, std::vector<TokenTag>{{1, 1}}, adjust), 1, 6, top_k(2), 0, smoothed);
  rank_experts(second.data(), nullptr, 1, 6, top_k(2), 0, plain);
  EXPECT_EQ(smoothed.experts, (std::vector<std::uint32_t>{0, 1}));
  EXPECT_EQ(plain.experts, (std::vector<std::uint32_t>{0, 2}));
}

// Several steps of a 2-layer job with every policy on, decided by 1 and by 3
// "ranks": each rank's routing, the flips and the biases are the same.
TEST(RouterPolicies, LostPairsCountThePlainPairsTheFinalRoutingLacks) {
  const auto routing = [](std::vector<std::vector<std::uint32_t>> tokens) {
    Routing r;
    for (const auto& experts : tokens) {
      for (std::uint32_t e : experts) r.add(e, 1.0f / float(experts.size()));
      r.end_token();
    }
    return r;
  };
  const Routing plain = routing({{0, 1}, {2, 3}, {4, 5}, {1, 0}});
  // Token 0 unchanged (order does not matter), 1 lost expert 3 to a demotion,
  // 2 lost both (a bias's other choice), 3 had one pair dropped.
  const Routing final = routing({{1, 0}, {2, 5}, {0, 1}, {1}});
  EXPECT_EQ(lost_pairs(plain, final), 4u);
  EXPECT_EQ(lost_pairs(plain, plain), 0u);
  test::expect_error([&] { lost_pairs(plain, routing({{0, 1}})); }, ErrorKind::Internal, {"4 tokens against 1"});
}

TEST(RouterPolicies, CountersTravelAsWordsAndAddUp) {
  RouterCounters a;
  a.tokens = 1, a.pairs = 2, a.moved = 3, a.dropped = 4, a.weight_moved = 5, a.weight_dropped = 6;
  a.flip_tested = 7, a.flipped = 8, a.jitter_tested = 9, a.jitter_changed = {10, 11}, a.selected = 12, a.changed = 13;
  const auto w = a.words();
  EXPECT_EQ(RouterCounters::from_words(w).words(), w);
  RouterCounters b = a;
  b.add(a);
  EXPECT_EQ(b.selected, 24u);
  EXPECT_EQ(b.changed, 26u);
}

TEST(RouterPolicies, AdjustmentsWithoutTheBiasKeepTheSmoothing) {
  const Config c = policies_config(1.0, LoadPolicy::none, 0.5);
  RouterPolicies p(c, 2, 6);
  ASSERT_TRUE(p.rebalances());
  p.end_layer(0, std::vector<std::uint64_t>{10, 0, 0, 0, 0, 2});  // mean 2: expert 0 over, 1-4 under, 5 at it
  std::vector<double> adjust;
  const std::vector<TokenTag> first{{42, 0}};
  const double* with = p.adjustments(0, first, adjust);
  ASSERT_NE(with, nullptr);
  EXPECT_EQ(std::vector<double>(with, with + 6), (std::vector<double>{-0.5, 0.5, 0.5, 0.5, 0.5, 0}));
  const double* without = p.adjustments(0, first, adjust, false);
  ASSERT_NE(without, nullptr) << "smoothing is on";
  EXPECT_EQ(std::vector<double>(without, without + 6), std::vector<double>(6, 0.0)) << "no bias, no bonus yet";
  RouterPolicies bias_only(policies_config(0, LoadPolicy::none, 0.5), 2, 6);
  EXPECT_NE(bias_only.adjustments(0, first, adjust), nullptr);
  EXPECT_EQ(bias_only.adjustments(0, first, adjust, false), nullptr);
  EXPECT_FALSE(RouterPolicies(policies_config(1.0, LoadPolicy::none, 0), 2, 6).rebalances());
  EXPECT_TRUE(RouterPolicies(policies_config(0, LoadPolicy::drop, 0), 2, 6).rebalances());
}

TEST(RouterPolicies, WithDemotionTheBiasFollowsTheLoadsBeforeIt) {
  // Every token prefers expert 0; demotion at the mean caps it at the mean,
  // so its final load is not over the mean, yet its bias must still fall.
  const std::size_t T = 12, E = 12;
  Config c = policies_config(0, LoadPolicy::demote, 0.1);
  c.router.demotion_threshold = 1.0;
  RouterPolicies p(c, 2, int(E));
  // Expert 0 first, then each token's own order of the others (room for the demoted pairs).
  std::vector<float> logits(T * E, 0.0f);
  for (std::size_t t = 0; t < T; ++t) {
    logits[t * E] = 5;
    for (std::size_t j = 0; j + 1 < E; ++j) logits[t * E + 1 + (t + j) % (E - 1)] = 2.0f - 0.1f * float(j);
  }
  Ranked all;
  rank_experts(logits.data(), nullptr, T, E, top_k(2), p.extra_candidates(), all);
  const std::vector<TokenTag> tags(T, TokenTag{});
  Routing mine;
  RouterCounters n;
  p.decide(0, all, tags, 0, T, std::vector<std::uint32_t>(E, 1), mine, n);
  std::vector<std::uint64_t> load(E, 0);
  for (std::uint32_t e : mine.experts) ++load[e];
  ASSERT_LE(load[0] * E, T * 2) << "demotion capped expert 0 at the mean";
  p.end_layer(0, load);
  EXPECT_EQ(p.biases()[0], -0.1);
  // Without a load policy the bias follows the loads it is given.
  RouterPolicies plain(policies_config(0, LoadPolicy::none, 0.1), 2, int(E));  // (12 experts: only sizes its biases)
  plain.end_layer(0, load);
  EXPECT_GE(plain.biases()[0], 0.0);
}

TEST(RouterPolicies, RanksDecideAsOneWithEveryPolicyOn) {
  const std::size_t T = 90, E = 6;
  Config c = policies_config(0.3, LoadPolicy::demote, 0.01);
  c.router.measure_jitter = true;
  std::vector<RouterPolicies> one{RouterPolicies(c, 2, 6)}, three(3, RouterPolicies(c, 2, 6));
  const std::vector<std::size_t> first{0, 30, 61, 90};
  const std::vector<std::uint32_t> replicas(E, 1);
  for (std::uint64_t step = 0; step < 6; ++step) {
    for (int layer = 0; layer < 2; ++layer) {
      std::vector<TokenTag> tags;
      for (std::size_t t = 0; t < T; ++t) tags.push_back({t % 45, std::uint32_t(step * 2 + t / 45)});
      auto logits = random_logits(T * E, step * 7 + std::uint64_t(layer));
      for (std::size_t t = 0; t < T; ++t) logits[t * E] += 1.0f;  // a hot expert
      // Each rank ranks its own tokens with its own adjustments, then all decide.
      const auto decide_all = [&](std::vector<RouterPolicies>& ranks) {
        const std::size_t R = ranks.size();
        Ranked all;
        std::vector<Routing> mine(R);
        for (std::size_t r = 0; r < R; ++r) {
          const std::size_t a = first[r * 3 / R], b = first[(r + 1) * 3 / R];
          std::vector<double> adjust;
          const double* adj = ranks[r].adjustments(layer, std::span(tags).subspan(a, b - a), adjust);
          rank_experts(logits.data() + a * E, adj, b - a, E, top_k(2), ranks[r].extra_candidates(), all);
        }
        std::vector<RouterCounters> n(R);
        std::vector<std::uint64_t> load(E, 0);
        for (std::size_t r = 0; r < R; ++r) {
          const std::size_t a = first[r * 3 / R], b = first[(r + 1) * 3 / R];
          ranks[r].decide(layer, all, tags, a, b - a, replicas, mine[r], n[r]);
          for (std::uint32_t e : mine[r].experts) ++load[e];
        }
        for (auto& p : ranks) p.end_layer(layer, load);
        Routing joined;
        RouterCounters sum;
        for (std::size_t r = 0; r < R; ++r) {
          for (std::size_t t = 0; t < mine[r].tokens(); ++t) {
            for (std::size_t i = 0; i < mine[r].experts_of(t).size(); ++i)
              joined.add(mine[r].experts_of(t)[i], mine[r].weights_of(t)[i]);
            joined.end_token();
          }
          sum.add(n[r]);
        }
        return std::pair{joined, sum};
      };
      const auto [a, na] = decide_all(one);
      const auto [b, nb] = decide_all(three);
      ASSERT_EQ(a.experts, b.experts) << "step " << step << " layer " << layer;
      ASSERT_EQ(a.weights, b.weights) << "step " << step << " layer " << layer;
      EXPECT_EQ(na.words(), nb.words());
      EXPECT_EQ(na.pairs, T * 2);
      if (step > 0) {
        EXPECT_EQ(na.flip_tested, T) << "every request's previous position is known";
      }
    }
    for (auto& p : one) p.end_step();
    for (auto& p : three) p.end_step();
  }
  for (const auto& p : three) EXPECT_EQ(p.biases(), one[0].biases());
  EXPECT_NE(one[0].biases(), std::vector<double>(2 * E, 0.0));
  EXPECT_EQ(one[0].remembered_requests(), 45u);
}

}  // namespace
}  // namespace moed::runtime
