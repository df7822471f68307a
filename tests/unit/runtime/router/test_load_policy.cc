// Load policies (runtime/router/policies/load_policy.h): drop and demote,
// worked out by hand on a small step, then their invariants on random steps
// (top-k and top-p, replicas, all experts over the threshold, k = experts),
// and that the decision does not depend on which tokens a rank counts.
#include "runtime/router/policies/load_policy.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <iterator>
#include <set>
#include <string>
#include <vector>

#include "common/rng.h"
#include "runtime/router/policies/spread_bound.h"

namespace moed::runtime {
namespace {

struct HandToken {
  std::vector<std::uint32_t> experts;
  std::vector<double> probs;
  std::uint32_t chosen;
};

Ranked ranked_of(const std::vector<HandToken>& tokens) {
  Ranked r;
  for (const HandToken& t : tokens) {
    r.experts.insert(r.experts.end(), t.experts.begin(), t.experts.end());
    r.probs.insert(r.probs.end(), t.probs.begin(), t.probs.end());
    r.end_token(t.chosen);
  }
  return r;
}

// Four tokens of top-2 over 4 experts, all choosing expert 0: capacity_factor
// 1 gives every expert 8 / 4 = 2 pairs of room.
//   by gate weight: t2e0 .778, t0e0 .667, t1e0 .556, t3e0 .5, t3e1 .5, t1e2 .444, t0e1 .333, t2e3 .222
// Expert 0 keeps t2 and t0; t1e0 and t3e0 are over.
const std::vector<HandToken> kHand = {
    {{0, 1, 2, 3}, {0.6, 0.3, 0.06, 0.04}, 2},
    {{0, 2, 1, 3}, {0.5, 0.4, 0.06, 0.04}, 2},
    {{0, 3, 1, 2}, {0.7, 0.2, 0.06, 0.04}, 2},
    {{0, 1, 3, 2}, {0.45, 0.45, 0.06, 0.04}, 2},
};
const std::vector<std::uint32_t> kOneReplicaEach = {1, 1, 1, 1};

std::vector<std::uint32_t> experts_of(const Routing& r, std::size_t t) {
  const auto s = r.experts_of(t);
  return {s.begin(), s.end()};
}

TEST(LoadPolicy, DropKeepsTheHighestWeightsAndRenormalisesTheRest) {
  Routing out;
  const LoadOutcome o = apply_load_policy(ranked_of(kHand), kOneReplicaEach, {LoadPolicy::drop, 1.0, 0.85, {}}, 0, 4, out);
  ASSERT_EQ(out.tokens(), 4u);
  EXPECT_EQ(experts_of(out, 0), (std::vector<std::uint32_t>{0, 1}));
  EXPECT_EQ(experts_of(out, 1), (std::vector<std::uint32_t>{2}));
  EXPECT_EQ(experts_of(out, 2), (std::vector<std::uint32_t>{0, 3}));
  EXPECT_EQ(experts_of(out, 3), (std::vector<std::uint32_t>{1}));
  EXPECT_EQ(out.weights_of(1)[0], 1.0f);
  EXPECT_EQ(out.weights_of(3)[0], 1.0f);
  EXPECT_EQ(o.pairs, 8u);
  EXPECT_EQ(o.dropped, 2u);
  EXPECT_EQ(o.moved, 0u);
  EXPECT_NEAR(double(o.weight_dropped) / kWeightUnit, 0.5 / 0.9 + 0.5, 1e-9);
}

TEST(LoadPolicy, DemoteMovesToTheNextRankedExpertUnderItsRoom) {
  // Threshold 1: the room is the capacity, 2. t1e0 tries e1 (full: t0, t3),
  // then e3 (1 pair): takes it. t3e0 tries e3 (now full), then e2: takes it.
  Routing out;
  const LoadOutcome o =
      apply_load_policy(ranked_of(kHand), kOneReplicaEach, {LoadPolicy::demote, 1.0, 1.0, {}}, 0, 4, out);
  EXPECT_EQ(experts_of(out, 0), (std::vector<std::uint32_t>{0, 1}));
  EXPECT_EQ(experts_of(out, 1), (std::vector<std::uint32_t>{3, 2}));
  EXPECT_EQ(experts_of(out, 2), (std::vector<std::uint32_t>{0, 3}));
  EXPECT_EQ(experts_of(out, 3), (std::vector<std::uint32_t>{2, 1}));
  // Weights renormalised over the new experts' own probabilities.
  EXPECT_EQ(out.weights_of(1)[0], float(0.04 / 0.44));
  EXPECT_EQ(out.weights_of(1)[1], float(0.4 / 0.44));
  EXPECT_EQ(out.weights_of(3)[0], float(0.04 / (0.04 + 0.45)));
  EXPECT_EQ(o.moved, 2u);
  EXPECT_EQ(o.dropped, 0u);
  EXPECT_NEAR(double(o.weight_moved) / kWeightUnit, 0.5 / 0.9 + 0.5, 1e-9);
}

TEST(LoadPolicy, ReplicasAddUpTheirRoom) {
  // Expert 0 on two replicas has 4 pairs of room: nothing is over.
  for (LoadPolicy p : {LoadPolicy::drop, LoadPolicy::demote}) {
    Routing out, plain;
    const LoadOutcome o = apply_load_policy(ranked_of(kHand), std::vector<std::uint32_t>{2, 1, 1, 1}, {p, 1.0, 1.0, {}},
                                            0, 4, out);
    choose(ranked_of(kHand), RouterSpec{}, plain);
    EXPECT_EQ(o.moved + o.dropped, 0u);
    EXPECT_EQ(out.experts, plain.experts);
    EXPECT_EQ(out.weights, plain.weights);
  }
}

TEST(LoadPolicy, AllExpertsOverTheThresholdDemotesNothingAndDropsAll) {
  // capacity_factor 0.1: room 0.2 pairs per expert, less than one.
  Routing demoted, dropped, plain;
  choose(ranked_of(kHand), RouterSpec{}, plain);
  const LoadOutcome d = apply_load_policy(ranked_of(kHand), kOneReplicaEach, {LoadPolicy::demote, 0.1, 0.85, {}}, 0, 4, demoted);
  EXPECT_EQ(d.moved, 0u);
  EXPECT_EQ(demoted.experts, plain.experts);
  EXPECT_EQ(demoted.weights, plain.weights);
  const LoadOutcome x = apply_load_policy(ranked_of(kHand), kOneReplicaEach, {LoadPolicy::drop, 0.1, 0.85, {}}, 0, 4, dropped);
  EXPECT_EQ(x.dropped, 8u);
  for (std::size_t t = 0; t < 4; ++t) EXPECT_TRUE(dropped.experts_of(t).empty()) << "token " << t;
}

TEST(LoadPolicy, KEqualToExpertsHasNowhereToDemote) {
  // Every token uses all 3 experts: no candidate is left for a demoted pair.
  const std::vector<HandToken> all3 = {{{0, 1, 2}, {0.5, 0.3, 0.2}, 3}, {{1, 0, 2}, {0.6, 0.3, 0.1}, 3},
                                       {{2, 0, 1}, {0.7, 0.2, 0.1}, 3}};
  Routing out, plain;
  choose(ranked_of(all3), RouterSpec{}, plain);
  const LoadOutcome o = apply_load_policy(ranked_of(all3), std::vector<std::uint32_t>{1, 1, 1},
                                          {LoadPolicy::demote, 1.0, 0.5, {}}, 0, 3, out);
  EXPECT_EQ(o.moved, 0u);
  EXPECT_EQ(out.experts, plain.experts);
  Routing dropped;
  const LoadOutcome x = apply_load_policy(ranked_of(all3), std::vector<std::uint32_t>{1, 1, 1},
                                          {LoadPolicy::drop, 0.5, 0.85, {}}, 0, 3, dropped);
  EXPECT_EQ(x.dropped, 9u - 3u);  // room 1.5: each expert keeps its single heaviest pair
}

TEST(LoadPolicy, ATokenWithoutExpertsStaysWithout) {
  // A replayed trace may leave a token without routing at a layer.
  std::vector<HandToken> tokens = kHand;
  tokens.push_back({{}, {}, 0});
  for (LoadPolicy p : {LoadPolicy::drop, LoadPolicy::demote}) {
    Routing out;
    const LoadOutcome o = apply_load_policy(ranked_of(tokens), kOneReplicaEach, {p, 1.0, 1.0, {}}, 0, 5, out);
    ASSERT_EQ(out.tokens(), 5u);
    EXPECT_TRUE(out.experts_of(4).empty());
    EXPECT_EQ(o.pairs, 8u);
  }
}

// Demotion to a target spread on a skewed step whose tokens rank every
// expert: the loads come to the target (within whole pairs), no fewer pairs
// move than the bound allows and hardly more, and a pair lands only on an
// expert under the level's top.
TEST(LoadPolicy, DemoteToATargetSpreadMovesAboutTheBoundsPairs) {
  constexpr std::size_t kTokens = 400, kExperts = 8;
  Ranked all;
  Rng rng(29);
  std::vector<std::uint32_t> order(kExperts);
  for (std::size_t t = 0; t < kTokens; ++t) {
    for (std::uint32_t e = 0; e < kExperts; ++e) order[e] = e;
    for (std::size_t i = kExperts - 1; i > 0; --i) std::swap(order[i], order[std::size_t(rng.uniform() * float(i + 1)) % (i + 1)]);
    if (rng.uniform() < 0.5f) std::swap(order[0], *std::find(order.begin(), order.end(), 0u));
    double p = 0.5;
    for (std::uint32_t e : order) all.experts.push_back(e), all.probs.push_back(p *= 0.6);
    all.end_token(2);
  }
  std::vector<double> before(kExperts, 0.0);
  for (std::size_t t = 0; t < kTokens; ++t)
    for (std::uint32_t e : all.experts_of(t).first(2)) before[e] += 1;
  for (double target : {0.05, 0.1, 0.2}) {
    SCOPED_TRACE(testing::Message() << "target " << target);
    LoadParams params{LoadPolicy::demote, 1.0, 1.0, {}};
    params.target_spread = target;
    Routing out;
    const LoadOutcome o = apply_load_policy(all, std::vector<std::uint32_t>(kExperts, 1), params, 0, kTokens, out);
    std::vector<double> after(kExperts, 0.0);
    for (std::uint32_t e : out.experts) after[e] += 1;
    double mean = 0, var = 0;
    for (double v : after) mean += v / kExperts;
    for (double v : after) var += (v - mean) * (v - mean) / kExperts;
    EXPECT_LE(std::sqrt(var) / mean, target + 2 / mean);  // whole pairs: within a pair or so of each level
    const std::vector<std::vector<double>> cells{before};
    const double bound = min_moves_for_spread(cells, target).moves;
    EXPECT_GE(double(o.moved), bound - 1e-9);
    EXPECT_LE(double(o.moved), bound + kExperts);
    const SpreadLevels at = levels_for_spread(before, target);
    for (std::size_t e = 0; e < kExperts; ++e)
      if (after[e] > before[e]) {
        EXPECT_LE(after[e], at.top) << "expert " << e;
      }
  }
}

// ---- random steps ------------------------------------------------------------------------

struct RandomCase {
  const char* name;
  LoadPolicy policy;
  double capacity_factor, threshold;
  bool top_p;  // chosen 1 to 3 per token
  bool replicas;
};

class LoadPolicyRandom : public ::testing::TestWithParam<RandomCase> {
 protected:
  static constexpr std::size_t kTokens = 300, kExperts = 8, kCandidates = 5;
  // A skewed step: expert 0 is every token's favourite half the time.
  Ranked step() const {
    Ranked r;
    Rng rng(hash_combine(17, std::uint64_t(GetParam().top_p)));
    std::vector<std::uint32_t> order(kExperts);
    for (std::size_t t = 0; t < kTokens; ++t) {
      for (std::uint32_t e = 0; e < kExperts; ++e) order[e] = e;
      for (std::size_t i = kExperts - 1; i > 0; --i) std::swap(order[i], order[std::size_t(rng.uniform() * float(i + 1)) % (i + 1)]);
      if (rng.uniform() < 0.5f) std::swap(order[0], *std::find(order.begin(), order.end(), 0u));
      double p = 0.6;
      for (std::size_t i = 0; i < kCandidates; ++i, p *= 0.5) {
        r.experts.push_back(order[i]);
        r.probs.push_back(p * (0.9 + 0.1 * rng.uniform()));
      }
      r.end_token(GetParam().top_p ? 1 + std::uint32_t(rng.uniform() * 3) % 3 : 2);
    }
    return r;
  }
  std::vector<std::uint32_t> replicas() const {
    std::vector<std::uint32_t> r(kExperts, 1);
    if (GetParam().replicas) r[1] = 3;  // not the hot expert 0: it must still overflow
    return r;
  }
  LoadParams params() const { return {GetParam().policy, GetParam().capacity_factor, GetParam().threshold, {}}; }
};

TEST_P(LoadPolicyRandom, TokensKeepDistinctExpertsWeightsSumToOneAndLoadsRespectTheRoom) {
  const Ranked all = step();
  Routing out;
  const LoadOutcome o = apply_load_policy(all, replicas(), params(), 0, kTokens, out);
  ASSERT_EQ(out.tokens(), kTokens);
  std::uint64_t chosen = 0;
  for (std::uint32_t k : all.chosen) chosen += k;
  EXPECT_EQ(o.pairs, chosen);
  std::vector<std::uint64_t> load(kExperts, 0);
  for (std::size_t t = 0; t < kTokens; ++t) {
    const auto e = out.experts_of(t);
    EXPECT_EQ(std::set<std::uint32_t>(e.begin(), e.end()).size(), e.size()) << "token " << t;
    if (GetParam().policy != LoadPolicy::drop) {
      EXPECT_EQ(e.size(), all.chosen[t]) << "token " << t;
    }
    double sum = 0;
    for (float w : out.weights_of(t)) sum += w;
    if (!e.empty()) {
      EXPECT_NEAR(sum, 1.0, 1e-6) << "token " << t;
    }
    for (std::uint32_t x : e) ++load[x];
  }
  EXPECT_EQ(out.pairs() + o.dropped, chosen);
  if (GetParam().policy == LoadPolicy::drop) {
    for (std::size_t e = 0; e < kExperts; ++e)
      EXPECT_LE(double(load[e]), expert_room(params(), chosen, kExperts, replicas()[e])) << "expert " << e;
  }
  if (GetParam().policy != LoadPolicy::none) {
    EXPECT_GT(o.moved + o.dropped, 0u) << "the step is skewed: some pair must go";
  }
}

// What only demotion does, on the demoting cases alone.
class LoadPolicyDemoteRandom : public LoadPolicyRandom {};

TEST_P(LoadPolicyDemoteRandom, ADemotedPairLandsOnlyUnderItsTargetsRoom) {
  ASSERT_EQ(GetParam().policy, LoadPolicy::demote);
  const Ranked all = step();
  Routing out;
  apply_load_policy(all, replicas(), params(), 0, kTokens, out);
  std::uint64_t chosen = 0;
  for (std::uint32_t k : all.chosen) chosen += k;
  // An expert over its room holds only pairs that were chosen for it (kept, or stuck).
  std::vector<std::uint64_t> load(kExperts, 0), arrived(kExperts, 0);
  for (std::size_t t = 0; t < kTokens; ++t)
    for (std::uint32_t e : out.experts_of(t)) {
      ++load[e];
      const auto first = all.experts_of(t).first(all.chosen[t]);
      arrived[e] += std::find(first.begin(), first.end(), e) == first.end();
    }
  for (std::size_t e = 0; e < kExperts; ++e)
    if (arrived[e]) {
      EXPECT_LE(double(load[e]), expert_room(params(), chosen, kExperts, replicas()[e])) << "expert " << e;
    }
}

TEST_P(LoadPolicyRandom, CountingByRanksAddsUpAndDecidesTheSame) {
  // Three "ranks" each count their own slice; the routing is the same whole.
  const Ranked all = step();
  Routing whole;
  const LoadOutcome w = apply_load_policy(all, replicas(), params(), 0, kTokens, whole);
  LoadOutcome sum;
  for (const auto& [first, n] : {std::pair<std::size_t, std::size_t>{0, 97}, {97, 101}, {198, 102}}) {
    Routing again;
    const LoadOutcome o = apply_load_policy(all, replicas(), params(), first, n, again);
    EXPECT_EQ(again.experts, whole.experts);
    for (std::size_t i = 0; i < whole.weights.size(); ++i)
      ASSERT_EQ(std::bit_cast<std::uint32_t>(again.weights[i]), std::bit_cast<std::uint32_t>(whole.weights[i]));
    sum.pairs += o.pairs, sum.moved += o.moved, sum.dropped += o.dropped;
    sum.weight_moved += o.weight_moved, sum.weight_dropped += o.weight_dropped;
  }
  EXPECT_EQ(sum.pairs, w.pairs);
  EXPECT_EQ(sum.moved, w.moved);
  EXPECT_EQ(sum.dropped, w.dropped);
  EXPECT_EQ(sum.weight_moved, w.weight_moved);
  EXPECT_EQ(sum.weight_dropped, w.weight_dropped);
}

TEST_P(LoadPolicyRandom, NoneIsTheRoutersOwnChoiceBitForBit) {
  const Ranked all = step();
  Routing out, plain;
  apply_load_policy(all, replicas(), {LoadPolicy::none, 1, 1, {}}, 0, kTokens, out);
  choose(all, RouterSpec{}, plain);
  EXPECT_EQ(out.offsets, plain.offsets);
  EXPECT_EQ(out.experts, plain.experts);
  EXPECT_EQ(out.weights, plain.weights);
}

const RandomCase kDropCases[] = {{"DropTopK", LoadPolicy::drop, 1.0, 0.85, false, false},
                                 {"DropTopPReplicas", LoadPolicy::drop, 1.25, 0.85, true, true}};
const RandomCase kDemoteCases[] = {{"DemoteTopK", LoadPolicy::demote, 1.25, 0.85, false, false},
                                   {"DemoteTopP", LoadPolicy::demote, 1.25, 0.85, true, false},
                                   {"DemoteReplicas", LoadPolicy::demote, 1.0, 1.0, false, true},
                                   {"DemoteLowThreshold", LoadPolicy::demote, 2.0, 0.6, false, false}};
std::vector<RandomCase> every_case() {
  std::vector<RandomCase> all(std::begin(kDropCases), std::end(kDropCases));
  all.insert(all.end(), std::begin(kDemoteCases), std::end(kDemoteCases));
  return all;
}
const auto case_name = [](const auto& info) { return std::string(info.param.name); };
INSTANTIATE_TEST_SUITE_P(Cases, LoadPolicyRandom, ::testing::ValuesIn(every_case()), case_name);
INSTANTIATE_TEST_SUITE_P(Cases, LoadPolicyDemoteRandom, ::testing::ValuesIn(kDemoteCases), case_name);

}  // namespace
}  // namespace moed::runtime
