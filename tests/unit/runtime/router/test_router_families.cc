// The router of every model family against a plain formula written from
// each family's reference code (docs/model-families.md), on random logits:
//   mixtral, qwen3_moe: softmax, top-k, renormalised;
//   olmoe, qwen2_moe: softmax, top-k, not renormalised;
//   deepseek_v3: sigmoid, selection bias for selection only, group-limited
//     top-k (groups by the sum of their top-2), renormalised, scaled;
//   gpt_oss: router bias (added to the logits before), top-k of the logits,
//     softmax over those k.
// Also: ties go to the lower expert id and group id, and a token's choice is
// the same whatever the batch it is routed in.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <string>
#include <vector>

#include "common/rng.h"
#include "runtime/config/model_family.h"
#include "runtime/router/router.h"

namespace moed::runtime {
namespace {

struct FamilyCase {
  Family family;
  int experts, top_k, groups, groups_kept;
};

std::string name_of_case(const ::testing::TestParamInfo<FamilyCase>& info) {
  return std::string(name_of(info.param.family)) + "_" + std::to_string(info.param.experts);
}

RouterSpec spec_of(const FamilyCase& c) {
  SyntheticKeys keys{c.family, c.groups, c.groups_kept, -1, 0};
  return synthetic_spec(keys, {1, c.experts, c.top_k, 64, 32, 1e-5}).router;
}

// The plain formula: indices sorted with a comparator written out per
// family, weights in double.
struct Choice {
  std::vector<std::uint32_t> experts;
  std::vector<double> weights;
};

Choice plain_formula(const FamilyCase& c, const RouterSpec& spec, const float* logits, const float* bias) {
  const int E = c.experts;
  const std::size_t n = std::size_t(E);
  std::vector<double> l(logits, logits + n), s(n), sel(n);
  auto rank = [](const std::vector<double>& v, std::vector<std::uint32_t> ids) {
    std::stable_sort(ids.begin(), ids.end(), [&](std::uint32_t a, std::uint32_t b) { return v[a] > v[b]; });
    return ids;
  };
  std::vector<std::uint32_t> all(n);
  std::iota(all.begin(), all.end(), 0u);
  Choice out;
  if (c.family == Family::gpt_oss) {
    // top-k of the logits, then the softmax over those k.
    std::vector<std::uint32_t> top = rank(l, all);
    top.resize(std::size_t(c.top_k));
    double mx = l[top[0]], sum = 0;
    for (std::uint32_t e : top) sum += std::exp(l[e] - mx);
    for (std::uint32_t e : top) out.experts.push_back(e), out.weights.push_back(std::exp(l[e] - mx) / sum);
    return out;
  }
  if (c.family == Family::deepseek_v3) {
    for (int e = 0; e < E; ++e) s[e] = 1 / (1 + std::exp(-l[e])), sel[e] = s[e] + bias[e];
    const int G = spec.groups, per = E / G;
    const std::size_t n_groups = std::size_t(G);
    std::vector<double> group(n_groups);
    for (int g = 0; g < G; ++g) {
      std::vector<double> members(sel.begin() + g * per, sel.begin() + (g + 1) * per);
      std::sort(members.rbegin(), members.rend());
      group[g] = members[0] + members[1];
    }
    std::vector<std::uint32_t> gids(n_groups);
    std::iota(gids.begin(), gids.end(), 0u);
    gids = rank(group, gids);
    std::vector<std::uint32_t> allowed;
    for (int i = 0; i < spec.groups_kept; ++i)
      for (int e = 0; e < per; ++e) allowed.push_back(gids[i] * std::uint32_t(per) + std::uint32_t(e));
    std::sort(allowed.begin(), allowed.end());
    std::vector<std::uint32_t> top = rank(sel, allowed);
    top.resize(std::size_t(c.top_k));
    double sum = 0;
    for (std::uint32_t e : top) sum += s[e];
    for (std::uint32_t e : top) out.experts.push_back(e), out.weights.push_back(s[e] / sum * 2.5);
    return out;
  }
  // Softmax families.
  const double mx = *std::max_element(l.begin(), l.end());
  double z = 0;
  for (int e = 0; e < E; ++e) z += std::exp(l[e] - mx);
  for (int e = 0; e < E; ++e) s[e] = std::exp(l[e] - mx) / z;
  std::vector<std::uint32_t> top = rank(s, all);
  top.resize(std::size_t(c.top_k));
  const bool renormalised = c.family == Family::mixtral || c.family == Family::qwen3_moe;
  double sum = 0;
  for (std::uint32_t e : top) sum += s[e];
  for (std::uint32_t e : top) out.experts.push_back(e), out.weights.push_back(renormalised ? s[e] / sum : s[e]);
  return out;
}

class RouterFamilies : public ::testing::TestWithParam<FamilyCase> {
 protected:
  void SetUp() override {
    const FamilyCase& c = GetParam();
    params_.top_k = c.top_k;
    params_.spec = spec_of(c);
    Rng rng(0x5eed + std::uint64_t(c.family));
    logits_.resize(std::size_t(kTokens) * std::size_t(c.experts));
    for (float& v : logits_) v = float(rng.uniform() * 6 - 3);
    if (params_.spec.gate_bias) {  // the router bias is added to the logits before the router
      std::vector<float> b(std::size_t(c.experts));
      for (float& v : b) v = float(rng.uniform() - 0.5);
      for (int t = 0; t < kTokens; ++t)
        for (int e = 0; e < c.experts; ++e) logits_[std::size_t(t * c.experts + e)] += b[std::size_t(e)];
    }
    if (params_.spec.selection_bias) {
      bias_.resize(std::size_t(c.experts));
      for (float& v : bias_) v = float(rng.uniform() * 0.2 - 0.1);
    }
  }
  RouterParams params() const { return params_.at_layer(bias_); }

  static constexpr int kTokens = 200;
  RouterParams params_;
  std::vector<float> logits_, bias_;
};

TEST_P(RouterFamilies, AgreeWithThePlainFormula) {
  const FamilyCase& c = GetParam();
  Routing r;
  route(logits_.data(), kTokens, std::size_t(c.experts), params(), r);
  ASSERT_EQ(r.tokens(), std::size_t(kTokens));
  for (int t = 0; t < kTokens; ++t) {
    const Choice want =
        plain_formula(c, params_.spec, logits_.data() + std::size_t(t * c.experts), bias_.empty() ? nullptr : bias_.data());
    const auto experts = r.experts_of(std::size_t(t));
    const auto weights = r.weights_of(std::size_t(t));
    ASSERT_EQ(std::vector<std::uint32_t>(experts.begin(), experts.end()), want.experts) << "token " << t;
    for (std::size_t i = 0; i < want.weights.size(); ++i)
      EXPECT_NEAR(weights[i], want.weights[i], 2e-7 * std::max(1.0, want.weights[i])) << "token " << t << " pair " << i;
  }
}

TEST_P(RouterFamilies, ATokensChoiceIsTheSameInAnyBatch) {
  const FamilyCase& c = GetParam();
  const std::size_t E = std::size_t(c.experts);
  Routing together;
  route(logits_.data(), kTokens, E, params(), together);
  for (int t = 0; t < kTokens; t += 7) {
    Routing alone;
    route(logits_.data() + std::size_t(t) * E, 1, E, params(), alone);
    const auto a = alone.weights_of(0), b = together.weights_of(std::size_t(t));
    ASSERT_EQ(a.size(), b.size());
    for (std::size_t i = 0; i < a.size(); ++i) {
      EXPECT_EQ(alone.experts_of(0)[i], together.experts_of(std::size_t(t))[i]);
      EXPECT_EQ(std::bit_cast<std::uint32_t>(a[i]), std::bit_cast<std::uint32_t>(b[i]));
    }
  }
}

TEST_P(RouterFamilies, TiesGoToTheLowerExpertAndGroup) {
  const FamilyCase& c = GetParam();
  // Every logit equal: every group and every expert ties.
  std::vector<float> flat(std::size_t(c.experts), 0.5f);
  RouterParams p = params_;
  p.selection_bias = nullptr;
  Routing r;
  route(flat.data(), 1, flat.size(), p, r);
  for (int i = 0; i < c.top_k; ++i) EXPECT_EQ(r.experts_of(0)[std::size_t(i)], std::uint32_t(i));
}

INSTANTIATE_TEST_SUITE_P(Families, RouterFamilies,
                         ::testing::Values(FamilyCase{Family::mixtral, 8, 2, 0, 0},
                                           FamilyCase{Family::qwen3_moe, 128, 8, 0, 0},
                                           FamilyCase{Family::qwen2_moe, 60, 4, 0, 0},
                                           FamilyCase{Family::olmoe, 64, 8, 0, 0},
                                           FamilyCase{Family::gpt_oss, 32, 4, 0, 0},
                                           FamilyCase{Family::deepseek_v3, 256, 8, 8, 4},
                                           FamilyCase{Family::deepseek_v3, 16, 4, 4, 2}),
                         name_of_case);

TEST(DeepSeekRouter, OnlyTheKeptGroupsAreChosen) {
  // 4 groups of 4, 1 kept: group 2 holds the best pair sum, though expert 0 is the single best.
  std::vector<float> logits(16, -4.0f);
  logits[0] = 4.0f;                // group 0: one strong expert
  logits[8] = logits[9] = 3.0f;    // group 2: two good ones (their sum wins)
  RouterParams p;
  p.top_k = 2;
  p.spec = synthetic_spec({Family::deepseek_v3, 4, 1, -1, 0}, {1, 16, 2, 64, 32, 1e-5}).router;
  std::vector<float> zero(16, 0.0f);
  Routing r;
  route(logits.data(), 1, 16, p.at_layer(zero), r);
  EXPECT_EQ(r.experts_of(0)[0], 8u);
  EXPECT_EQ(r.experts_of(0)[1], 9u);
  // Equal weights 0.5 each, times 2.5.
  EXPECT_FLOAT_EQ(r.weights_of(0)[0], 1.25f);
}

TEST(DeepSeekRouter, TheSelectionBiasChoosesButDoesNotWeigh) {
  std::vector<float> logits{1.0f, 0.0f, -1.0f, -2.0f};
  std::vector<float> bias{0.0f, 0.0f, 0.0f, 1.0f};  // expert 3 selected despite the lowest score
  RouterParams p;
  p.top_k = 2;
  p.spec = synthetic_spec({Family::deepseek_v3, 1, 1, -1, 0}, {1, 4, 2, 64, 32, 1e-5}).router;
  Routing r;
  route(logits.data(), 1, 4, p.at_layer(bias), r);
  EXPECT_EQ(r.experts_of(0)[0], 3u);
  EXPECT_EQ(r.experts_of(0)[1], 0u);
  const double s3 = 1 / (1 + std::exp(2.0)), s0 = 1 / (1 + std::exp(-1.0));
  EXPECT_NEAR(r.weights_of(0)[0], s3 / (s3 + s0) * 2.5, 1e-6);
  EXPECT_NEAR(r.weights_of(0)[1], s0 / (s3 + s0) * 2.5, 1e-6);
}

TEST(RouterWeights, WithoutRenormalisationTheScoresAreTheWeights) {
  RouterSpec spec;
  spec.renormalize = false;
  spec.scaling = 1.0;
  Routing r;
  const std::uint32_t experts[] = {3, 1};
  const double scores[] = {0.4, 0.1};
  add_weights(experts, scores, spec, r);
  EXPECT_FLOAT_EQ(r.weights[0], 0.4f);
  EXPECT_FLOAT_EQ(r.weights[1], 0.1f);
}

}  // namespace
}  // namespace moed::runtime
