// Adversarial rows among normal ones in one batch, for the router of every
// family (and top-p), its load policies, and the RMSNorm in front of it
// (issue 29, item 3: the router scores fp32 logits in double whatever the
// experts are, and the RMSNorm's eps is [model].norm_eps, never a tensor's).
// The rows: 1e30, 1e-30, zero, all logits equal, -1e30, +-1e30 alternating,
// a NaN, a +inf, every logit NaN (what a NaN or inf hidden row becomes
// through the gate).
//   (a) A normal row's experts and weights are bitwise those it gets routed
//       alone, whatever shares its batch; so is every other row's. Under a
//       load policy, where a non-finite row sits changes no row's decision.
//   (b) The extreme finite rows give finite weights that sum as the family
//       renormalises (to routed_scaling_factor; to the chosen scores without
//       renormalisation), ties to the lower expert id. A row whose chosen
//       sigmoid scores all underflow to 0 (-1e30) weighs 0, as Hugging Face's
//       DeepSeek-V3 (sum + 1e-20), not 0/0.
//   (c) A non-finite logit is defined: a NaN score ranks below every number,
//       so a softmax row holding a NaN or a +inf (every score NaN) takes
//       experts 0..k-1 with NaN weights, which the engine counts as non-finite
//       terms; a sigmoid row routes as if the NaN logit were -inf, and its
//       +inf as 1e30. The front door refuses NaN and inf rows before they get
//       here (not_finite); a checkpoint loaded with check_finite = false can
//       still hold a NaN gate row.
// The same rows through the route stage's arithmetic (RMSNorm with the
// config's eps, the fixed-order gate GEMM, gpt-oss's router bias, the router),
// and the RMSNorm alone at eps down to 0: finite rows stay finite.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>
#include <ostream>
#include <string>
#include <utility>
#include <vector>

#include "common/rng.h"
#include "kernels/cpu/fixed_order_gemm.h"
#include "kernels/cpu/rms_norm.h"
#include "runtime/config/config.h"
#include "runtime/config/model_family.h"
#include "runtime/router/policies/load_policy.h"
#include "runtime/router/router.h"
#include "tests/unit/test_support.h"

namespace moed::runtime {
namespace {

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();

struct RouterCase {
  const char* name;
  Family family;
  int experts, top_k, groups, groups_kept;
  bool greedy_groups = false;  // DeepSeek's group_limited_greedy: no selection bias, a group scored by its best
  bool top_p = false;          // [router].mode = topp: top_p 0.5, min_k 1, max_k top_k
};

std::string name_of_case(const ::testing::TestParamInfo<RouterCase>& info) { return info.param.name; }
void PrintTo(const RouterCase& c, std::ostream* os) { *os << c.name; }

RouterParams params_of(const RouterCase& c) {
  RouterParams p;
  p.top_k = c.top_k;
  p.max_k = c.top_k;
  p.spec = synthetic_spec({c.family, c.groups, c.groups_kept, -1, 0}, {1, c.experts, c.top_k, 64, 32, 1e-5}).router;
  if (c.greedy_groups) p.spec.selection_bias = false;
  if (c.top_p) {
    p.top_p_mode = true;
    p.top_p = 0.5f;
    p.min_k = 1;
  }
  return p;
}

bool renormalised(const RouterSpec& spec) { return spec.renormalize || spec.softmax_after_topk; }

// The kinds of logit rows; `normal` is random in [-3, 3).
enum class Row { normal, huge, tiny, zero, equal, negative_huge, alternating_huge, one_nan, one_inf, all_nan };
constexpr std::size_t kNanExpert = 3, kInfExpert = 5;

std::vector<float> logit_row(Row kind, std::size_t experts, std::uint64_t key) {
  std::vector<float> row(experts);
  CounterRng g(key);
  for (std::size_t e = 0; e < experts; ++e) row[e] = g.symmetric(e) * 3.0f;
  switch (kind) {
    case Row::normal: break;
    case Row::huge: row.assign(experts, 1e30f); break;
    case Row::tiny: row.assign(experts, 1e-30f); break;
    case Row::zero: row.assign(experts, 0.0f); break;
    case Row::equal: row.assign(experts, 0.75f); break;
    case Row::negative_huge: row.assign(experts, -1e30f); break;
    case Row::alternating_huge:
      for (std::size_t e = 0; e < experts; ++e) row[e] = e % 2 ? -1e30f : 1e30f;
      break;
    case Row::one_nan: row[kNanExpert] = kNaN; break;
    case Row::one_inf: row[kInfExpert] = kInf; break;
    case Row::all_nan: row.assign(experts, kNaN); break;
  }
  return row;
}

// Normal rows with every adversarial kind among them.
const std::vector<Row> kBatch = {Row::normal, Row::huge,          Row::normal,           Row::tiny,
                                 Row::normal, Row::normal,        Row::zero,             Row::equal,
                                 Row::normal, Row::negative_huge, Row::alternating_huge, Row::normal,
                                 Row::one_nan, Row::normal,       Row::one_inf,          Row::all_nan,
                                 Row::normal, Row::normal};

std::vector<float> logits_of(const std::vector<Row>& kinds, std::size_t experts) {
  std::vector<float> all;
  for (std::size_t t = 0; t < kinds.size(); ++t) {
    const std::vector<float> row = logit_row(kinds[t], experts, 0xad0 + t);
    all.insert(all.end(), row.begin(), row.end());
  }
  return all;
}

std::vector<std::uint32_t> experts_of(const Routing& r, std::size_t t) {
  const auto e = r.experts_of(t);
  return {e.begin(), e.end()};
}

std::vector<std::uint32_t> weight_bits_of(const Routing& r, std::size_t t) {
  std::vector<std::uint32_t> bits;
  for (float w : r.weights_of(t)) bits.push_back(std::bit_cast<std::uint32_t>(w));
  return bits;
}

// The experts 0, stride, 2 stride, ... (count of them).
std::vector<std::uint32_t> lowest(std::size_t count, std::uint32_t stride = 1) {
  std::vector<std::uint32_t> ids(count);
  for (std::size_t i = 0; i < count; ++i) ids[i] = std::uint32_t(i) * stride;
  return ids;
}

class RouterAdversarial : public ::testing::TestWithParam<RouterCase> {
 protected:
  void SetUp() override {
    const RouterCase& c = GetParam();
    experts_ = std::size_t(c.experts);
    params_ = params_of(c);
    if (params_.spec.selection_bias) {
      CounterRng g(0xb1a5);
      bias_.resize(experts_);
      for (std::size_t e = 0; e < experts_; ++e) bias_[e] = g.symmetric(e) * 0.1f;
      zero_bias_.assign(experts_, 0.0f);
    }
  }
  // With the layer's random selection bias (DeepSeek's), or none.
  RouterParams biased() const { return params_.at_layer(bias_); }
  // With an all-zero selection bias: it keeps the top-2 group scoring but breaks no tie.
  RouterParams unbiased() const { return params_.at_layer(zero_bias_); }
  // How many experts a row of all-NaN scores takes: top-p's mass is NaN, so min_k.
  std::size_t k_of_nan_row() const { return std::size_t(params_.top_p_mode ? params_.min_k : params_.top_k); }

  std::size_t experts_ = 0;
  RouterParams params_;
  std::vector<float> bias_, zero_bias_;
};

TEST_P(RouterAdversarial, EveryRowRoutesAsAlone) {
  const std::vector<float> logits = logits_of(kBatch, experts_);
  Routing together;
  route(logits.data(), kBatch.size(), experts_, biased(), together);
  ASSERT_EQ(together.tokens(), kBatch.size());
  for (std::size_t t = 0; t < kBatch.size(); ++t) {
    Routing alone;
    route(logits.data() + t * experts_, 1, experts_, biased(), alone);
    EXPECT_EQ(experts_of(together, t), experts_of(alone, 0)) << "row " << t;
    EXPECT_EQ(weight_bits_of(together, t), weight_bits_of(alone, 0)) << "row " << t;
    if (kBatch[t] != Row::normal) continue;
    // (a): nothing non-finite reaches a normal row, and it routes as a batch of normal rows alone would.
    for (float w : together.weights_of(t)) EXPECT_TRUE(std::isfinite(w)) << "row " << t;
  }
  std::vector<float> normal_logits;
  for (std::size_t t = 0; t < kBatch.size(); ++t)
    if (kBatch[t] == Row::normal)
      normal_logits.insert(normal_logits.end(), logits.begin() + std::ptrdiff_t(t * experts_),
                           logits.begin() + std::ptrdiff_t((t + 1) * experts_));
  Routing normal;
  route(normal_logits.data(), normal_logits.size() / experts_, experts_, biased(), normal);
  for (std::size_t t = 0, n = 0; t < kBatch.size(); ++t) {
    if (kBatch[t] != Row::normal) continue;
    EXPECT_EQ(experts_of(together, t), experts_of(normal, n)) << "row " << t;
    EXPECT_EQ(weight_bits_of(together, t), weight_bits_of(normal, n)) << "row " << t;
    ++n;
  }
}

// (b): each extreme finite row ties its candidates; which ones win, and the
// probability each of them has.
struct TiedRow {
  Row kind;
  std::uint32_t stride;  // the candidates: every expert (1) or the even ones (2)
  double softmax_score, sigmoid_score;
};

TEST_P(RouterAdversarial, ExtremeFiniteRowsGiveFiniteWeightsAndTiesGoLow) {
  const double E = double(experts_), sigmoid_075 = 1.0 / (1.0 + std::exp(-0.75));
  const std::vector<TiedRow> rows = {
      {Row::huge, 1, 1 / E, 1.0},          {Row::tiny, 1, 1 / E, 0.5},
      {Row::zero, 1, 1 / E, 0.5},          {Row::equal, 1, 1 / E, sigmoid_075},
      {Row::negative_huge, 1, 1 / E, 0.0}, {Row::alternating_huge, 2, 2 / E, 1.0},
  };
  const RouterSpec& spec = params_.spec;
  const bool sigmoid = spec.scoring == Scoring::sigmoid;
  for (const TiedRow& row : rows) {
    // Each extreme row between two normal ones.
    const std::vector<Row> kinds = {Row::normal, row.kind, Row::normal};
    const std::vector<float> logits = logits_of(kinds, experts_);
    Routing r;
    route(logits.data(), kinds.size(), experts_, unbiased(), r);
    const std::size_t k = r.experts_of(1).size();
    SCOPED_TRACE("row kind " + std::to_string(int(row.kind)) + ", k " + std::to_string(k));
    const double score = sigmoid ? row.sigmoid_score : row.softmax_score;
    if (params_.top_p_mode) {
      // top-p: the tied mass reaches 0.5 after 0.5 / score candidates.
      EXPECT_EQ(k, std::min<std::size_t>(std::size_t(params_.max_k), std::size_t(std::ceil(0.5 / score))));
    } else {
      EXPECT_EQ(k, std::size_t(params_.top_k));
    }
    EXPECT_EQ(experts_of(r, 1), lowest(k, row.stride));
    // Renormalised: scaling / k each, but 0 when every chosen score is 0 (HF's + 1e-20).
    const double want = !renormalised(spec) ? score * spec.scaling : score == 0 ? 0.0 : spec.scaling / double(k);
    double sum = 0;
    for (float w : r.weights_of(1)) {
      ASSERT_TRUE(std::isfinite(w));
      EXPECT_NEAR(w, want, 1e-6 * std::max(1.0, want));
      sum += w;
    }
    EXPECT_NEAR(sum, want * double(k), 1e-6 * double(k) * std::max(1.0, want));
    if (renormalised(spec) && score != 0) {
      EXPECT_NEAR(sum, spec.scaling, 1e-6 * spec.scaling);
    }
  }
}

TEST_P(RouterAdversarial, NonFiniteLogitsAreDefined) {
  const bool sigmoid = params_.spec.scoring == Scoring::sigmoid;
  const std::vector<float> nan_row = logit_row(Row::one_nan, experts_, 7), inf_row = logit_row(Row::one_inf, experts_, 8);
  const std::vector<float> all_nan = logit_row(Row::all_nan, experts_, 9);
  auto route_row = [&](const std::vector<float>& row) {
    Routing r;
    route(row.data(), 1, experts_, biased(), r);
    return r;
  };
  // Every logit NaN: every score NaN, all tied: the lowest experts, NaN weights.
  const Routing nans = route_row(all_nan);
  EXPECT_EQ(experts_of(nans, 0), lowest(k_of_nan_row()));
  for (float w : nans.weights_of(0)) EXPECT_TRUE(std::isnan(w));
  if (!sigmoid) {
    // softmax: one NaN or one +inf (inf - inf) makes every score NaN.
    for (const auto* row : {&nan_row, &inf_row}) {
      const Routing r = route_row(*row);
      EXPECT_EQ(experts_of(r, 0), lowest(k_of_nan_row()));
      for (float w : r.weights_of(0)) EXPECT_TRUE(std::isnan(w));
    }
    return;
  }
  // sigmoid: the NaN expert ranks last (as if its logit were -inf); +inf scores 1, as 1e30 does.
  std::vector<float> nan_as_minus_inf = nan_row, inf_as_huge = inf_row;
  nan_as_minus_inf[kNanExpert] = -kInf;
  inf_as_huge[kInfExpert] = 1e30f;
  for (const auto& [row, same] : {std::pair{&nan_row, &nan_as_minus_inf}, std::pair{&inf_row, &inf_as_huge}}) {
    const Routing r = route_row(*row), want = route_row(*same);
    EXPECT_EQ(experts_of(r, 0), experts_of(want, 0));
    EXPECT_EQ(weight_bits_of(r, 0), weight_bits_of(want, 0));
    double sum = 0;
    for (float w : r.weights_of(0)) {
      EXPECT_TRUE(std::isfinite(w));
      sum += w;
    }
    if (renormalised(params_.spec)) {
      EXPECT_NEAR(sum, params_.spec.scaling, 1e-6 * params_.spec.scaling);
    }
  }
  const std::vector<std::uint32_t> chosen = experts_of(route_row(nan_row), 0);
  EXPECT_EQ(std::find(chosen.begin(), chosen.end(), std::uint32_t(kNanExpert)), chosen.end());
}

// The load policies take every pair of the step in order of gate weight: a
// NaN row's pairs go after every number and a row whose chosen sigmoid scores
// all underflowed weighs 0, so where such a row sits in the batch changes
// no row's decision, and the weight the policy moved or dropped is counted
// in range (a NaN counts 0).
TEST_P(RouterAdversarial, LoadPoliciesTakeNonFiniteRowsLast) {
  constexpr std::size_t kNormalRows = 40;
  const std::vector<Row> adversarial = {Row::all_nan, Row::negative_huge, Row::one_nan, Row::one_inf};
  // Row i keeps its logits wherever it sits: the adversarial rows in the middle, or first.
  auto logits_in_order = [&](const std::vector<std::size_t>& order) {
    std::vector<float> all;
    for (std::size_t i : order) {
      const Row kind = i < kNormalRows ? Row::normal : adversarial[i - kNormalRows];
      const std::vector<float> row = logit_row(kind, experts_, 0x10ad + i);
      all.insert(all.end(), row.begin(), row.end());
    }
    return all;
  };
  const std::size_t rows = kNormalRows + adversarial.size();
  std::vector<std::size_t> middle(rows), front(rows);
  std::iota(middle.begin(), middle.end(), std::size_t(0));
  std::rotate(middle.begin() + 17, middle.begin() + kNormalRows, middle.end());
  std::iota(front.begin(), front.end(), std::size_t(0));
  std::rotate(front.begin(), front.begin() + kNormalRows, front.end());
  const std::vector<std::uint32_t> one_replica_each(experts_, 1);
  for (LoadPolicy policy : {LoadPolicy::drop, LoadPolicy::demote}) {
    SCOPED_TRACE(std::string(name_of(policy)));
    const LoadParams load{policy, 1.0, 0.85, params_.spec};
    Routing routed[2];
    LoadOutcome outcome[2];
    std::vector<std::size_t> position_of[2] = {std::vector<std::size_t>(rows), std::vector<std::size_t>(rows)};
    for (int p = 0; p < 2; ++p) {
      const std::vector<std::size_t>& order = p == 0 ? middle : front;
      for (std::size_t t = 0; t < rows; ++t) position_of[p][order[t]] = t;
      const std::vector<float> logits = logits_in_order(order);
      Ranked ranked;
      rank_experts(logits.data(), nullptr, rows, experts_, biased(), 2, ranked);
      outcome[p] = apply_load_policy(ranked, one_replica_each, load, 0, rows, routed[p]);
    }
    EXPECT_GT(outcome[0].dropped + outcome[0].moved, 0u);  // the policy acted
    EXPECT_EQ(outcome[0].pairs, outcome[1].pairs);
    EXPECT_EQ(outcome[0].dropped, outcome[1].dropped);
    EXPECT_EQ(outcome[0].moved, outcome[1].moved);
    EXPECT_EQ(outcome[0].weight_dropped, outcome[1].weight_dropped);
    EXPECT_EQ(outcome[0].weight_moved, outcome[1].weight_moved);
    EXPECT_LE(outcome[0].weight_dropped, outcome[0].dropped * std::uint64_t(kWeightUnit));
    EXPECT_LE(outcome[0].weight_moved, outcome[0].moved * std::uint64_t(kWeightUnit));
    for (std::size_t i = 0; i < rows; ++i) {
      const std::size_t a = position_of[0][i], b = position_of[1][i];
      EXPECT_EQ(experts_of(routed[0], a), experts_of(routed[1], b)) << "row " << i;
      EXPECT_EQ(weight_bits_of(routed[0], a), weight_bits_of(routed[1], b)) << "row " << i;
      if (i < kNormalRows || adversarial[i - kNormalRows] == Row::negative_huge) {
        for (float w : routed[0].weights_of(a)) EXPECT_TRUE(std::isfinite(w)) << "row " << i;
      }
    }
  }
}

// The route stage's arithmetic on hidden rows: RMSNorm with [model].norm_eps,
// the fixed-order gate GEMM, gpt-oss's router bias, then the router.
enum class Hidden { normal, huge, tiny, zero, near_max, one_nan, one_inf };
constexpr std::size_t kHidden = 64;

std::vector<float> hidden_row(Hidden kind, std::uint64_t key) {
  CounterRng g(key);
  std::vector<float> row(kHidden);
  for (std::size_t i = 0; i < kHidden; ++i) row[i] = g.normalish(i) * 2.0f;
  const auto scaled_signs = [&](float magnitude) {
    for (std::size_t i = 0; i < kHidden; ++i) row[i] = g.uniform(100 + i) < 0.5f ? -magnitude : magnitude;
  };
  switch (kind) {
    case Hidden::normal: break;
    case Hidden::huge: scaled_signs(1e30f); break;
    case Hidden::tiny: scaled_signs(1e-30f); break;
    case Hidden::zero: row.assign(kHidden, 0.0f); break;
    case Hidden::near_max: scaled_signs(3e38f); break;  // x² overflows fp32 (and the sum in float would)
    case Hidden::one_nan: row[7] = kNaN; break;
    case Hidden::one_inf: row[11] = kInf; break;
  }
  return row;
}

TEST_P(RouterAdversarial, HiddenRowsThroughNormGateAndRouter) {
  const Config config = default_config();  // [model].norm_eps = 1e-5
  CounterRng g(0x6a7e);
  std::vector<float> gate(experts_ * kHidden), norm_weight(kHidden), router_bias(experts_);
  for (std::size_t i = 0; i < gate.size(); ++i) gate[i] = g.symmetric(i) * 0.2f;
  for (std::size_t i = 0; i < kHidden; ++i) norm_weight[i] = 0.5f + g.uniform(1'000'000 + i);
  for (std::size_t e = 0; e < experts_; ++e) router_bias[e] = g.symmetric(2'000'000 + e) * 0.5f;
  const kernels::PackedWeights packed(gate.data(), experts_, kHidden);
  auto route_rows = [&](const std::vector<float>& x, std::size_t rows) {
    std::vector<float> xn(x.size()), logits(rows * experts_);
    kernels::rms_norm(x.data(), norm_weight.data(), rows, kHidden, float(config.model.norm_eps), xn.data());
    kernels::gemm_fixed_order(xn.data(), rows, packed, logits.data());
    if (params_.spec.gate_bias)
      for (std::size_t t = 0; t < rows; ++t)
        for (std::size_t e = 0; e < experts_; ++e) logits[t * experts_ + e] += router_bias[e];
    Routing r;
    route(logits.data(), rows, experts_, biased(), r);
    return r;
  };
  const std::vector<Hidden> kinds = {Hidden::normal, Hidden::huge,    Hidden::normal,  Hidden::tiny,
                                     Hidden::zero,   Hidden::normal,  Hidden::near_max, Hidden::one_nan,
                                     Hidden::normal, Hidden::one_inf, Hidden::normal};
  std::vector<float> x;
  for (std::size_t t = 0; t < kinds.size(); ++t) {
    const std::vector<float> row = hidden_row(kinds[t], 0x41d + t);
    x.insert(x.end(), row.begin(), row.end());
  }
  const Routing together = route_rows(x, kinds.size());
  for (std::size_t t = 0; t < kinds.size(); ++t) {
    SCOPED_TRACE("row " + std::to_string(t));
    const Routing alone =
        route_rows({x.begin() + std::ptrdiff_t(t * kHidden), x.begin() + std::ptrdiff_t((t + 1) * kHidden)}, 1);
    EXPECT_EQ(experts_of(together, t), experts_of(alone, 0));
    EXPECT_EQ(weight_bits_of(together, t), weight_bits_of(alone, 0));
    if (kinds[t] == Hidden::one_nan || kinds[t] == Hidden::one_inf) {
      // The normalised row holds a NaN, so every logit is NaN: the lowest experts, NaN weights.
      EXPECT_EQ(experts_of(together, t), lowest(k_of_nan_row()));
      for (float w : together.weights_of(t)) EXPECT_TRUE(std::isnan(w));
      continue;
    }
    double sum = 0;
    for (float w : together.weights_of(t)) {
      EXPECT_TRUE(std::isfinite(w));
      EXPECT_GE(w, 0.0f);
      sum += w;
    }
    if (renormalised(params_.spec)) {
      EXPECT_NEAR(sum, params_.spec.scaling, 1e-6 * params_.spec.scaling);
    } else {
      EXPECT_LE(sum, params_.spec.scaling * (1 + 1e-6));
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Families, RouterAdversarial,
    ::testing::Values(RouterCase{"mixtral", Family::mixtral, 8, 2, 0, 0},
                      RouterCase{"mixtral_top_p", Family::mixtral, 8, 4, 0, 0, false, true},
                      RouterCase{"qwen3_moe", Family::qwen3_moe, 128, 8, 0, 0},
                      RouterCase{"qwen2_moe", Family::qwen2_moe, 60, 4, 0, 0},
                      RouterCase{"olmoe", Family::olmoe, 64, 8, 0, 0},
                      RouterCase{"gpt_oss", Family::gpt_oss, 32, 4, 0, 0},
                      RouterCase{"deepseek_v3", Family::deepseek_v3, 256, 8, 8, 4},
                      RouterCase{"deepseek_v3_small", Family::deepseek_v3, 16, 4, 4, 2},
                      RouterCase{"deepseek_v3_greedy_groups", Family::deepseek_v3, 16, 4, 4, 2, true},
                      RouterCase{"deepseek_v3_one_group", Family::deepseek_v3, 16, 4, 1, 1}),
    name_of_case);

// The RMSNorm alone: extreme rows among normal ones, at eps from the default
// down to what no int8 scale could hold (1e-12) and 0 ([model].norm_eps may
// be 0; 1e-50 narrows to it in fp32): the seed article's quantized LayerNorm
// whose eps fell to 0 and gave NaN.
enum class NormRow { normal, huge, tiny, zero, near_max, subnormal, one_nan, one_inf };

class RmsNormAdversarial : public ::testing::TestWithParam<double> {};

// x / sqrt(mean(x²) + eps) * weight in double, eps as the kernel takes it (fp32).
std::vector<double> norm_formula(const float* x, const std::vector<float>& weight, float eps) {
  const std::size_t h = weight.size();
  double ss = 0;
  for (std::size_t i = 0; i < h; ++i) ss += double(x[i]) * double(x[i]);
  const double scale = 1.0 / std::sqrt(ss / double(h) + double(eps));
  std::vector<double> out(h);
  for (std::size_t i = 0; i < h; ++i) out[i] = double(x[i]) * scale * double(weight[i]);
  return out;
}

TEST_P(RmsNormAdversarial, FiniteRowsStayFiniteAndNormalRowsKeepTheirBits) {
  const float eps = float(GetParam());
  const std::size_t h = 37;
  const std::vector<NormRow> kinds = {NormRow::normal, NormRow::huge,    NormRow::tiny,      NormRow::normal,
                                      NormRow::zero,   NormRow::near_max, NormRow::subnormal, NormRow::normal,
                                      NormRow::one_nan, NormRow::one_inf, NormRow::normal};
  const std::size_t rows = kinds.size();
  CounterRng g(29);
  std::vector<float> x(rows * h), weight(h), out(rows * h);
  for (std::size_t i = 0; i < h; ++i) weight[i] = 0.5f + g.uniform(i);
  for (std::size_t r = 0; r < rows; ++r) {
    float* row = x.data() + r * h;
    const auto signs = [&](float magnitude) {
      for (std::size_t i = 0; i < h; ++i) row[i] = g.uniform(1000 * r + i) < 0.5f ? -magnitude : magnitude;
    };
    for (std::size_t i = 0; i < h; ++i) row[i] = g.normalish(1000 * r + i);
    switch (kinds[r]) {
      case NormRow::normal: break;
      case NormRow::huge: signs(1e30f); break;
      case NormRow::tiny: signs(1e-30f); break;
      case NormRow::zero: std::fill(row, row + h, 0.0f); break;
      case NormRow::near_max: signs(3e38f); break;
      case NormRow::subnormal: signs(1e-40f); break;  // its rms's inverse is past fp32 when eps is 0
      case NormRow::one_nan: row[4] = kNaN; break;
      case NormRow::one_inf: row[9] = kInf; break;
    }
  }
  kernels::rms_norm(x.data(), weight.data(), rows, h, eps, out.data());
  for (std::size_t r = 0; r < rows; ++r) {
    SCOPED_TRACE("row " + std::to_string(r));
    const float* o = out.data() + r * h;
    std::vector<float> alone(h);
    kernels::rms_norm(x.data() + r * h, weight.data(), 1, h, eps, alone.data());
    for (std::size_t i = 0; i < h; ++i) {
      if (!std::isnan(o[i])) {
        EXPECT_EQ(std::bit_cast<std::uint32_t>(o[i]), std::bit_cast<std::uint32_t>(alone[i]));
      }
    }
    if (kinds[r] == NormRow::one_nan) {
      for (std::size_t i = 0; i < h; ++i) EXPECT_TRUE(std::isnan(o[i])) << i;  // the rms is NaN
      continue;
    }
    if (kinds[r] == NormRow::one_inf) {
      // The rms is inf, its inverse 0: inf * 0 is NaN where the inf was, the rest 0.
      for (std::size_t i = 0; i < h; ++i) {
        if (i == 9) {
          EXPECT_TRUE(std::isnan(o[i]));
        } else {
          EXPECT_EQ(o[i], 0.0f) << i;
        }
      }
      continue;
    }
    if (kinds[r] == NormRow::zero) {
      for (std::size_t i = 0; i < h; ++i) EXPECT_EQ(o[i], 0.0f) << i;
      continue;
    }
    const std::vector<double> want = norm_formula(x.data() + r * h, weight, eps);
    for (std::size_t i = 0; i < h; ++i) {
      ASSERT_TRUE(std::isfinite(o[i])) << i;
      EXPECT_NEAR(o[i], want[i], 1e-6 * std::abs(want[i])) << i;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Eps, RmsNormAdversarial, ::testing::Values(1e-5, 1e-6, 1e-12, 0.0, 1e-50));

// The RMSNorm's eps is [model].norm_eps (config.json's rms_norm_eps for a
// checkpoint, unless [model] sets it), a double narrowed to fp32 once; no
// tensor holds it. A tiny row tells one eps from another.
std::vector<float> normalised_tiny_row(double norm_eps) {
  const std::vector<float> x = {1e-4f, -2e-4f, 3e-4f, -1e-4f}, weight(4, 1.0f);
  std::vector<float> out(4);
  kernels::rms_norm(x.data(), weight.data(), 1, 4, float(norm_eps), out.data());
  return out;
}

TEST(RouterNormEps, IsTheConfigsNormEps) {
  const Config fine = load_config_text("[model]\nnorm_eps = 1e-12\n", "t.toml", {});
  const Config coarse = load_config_text("[model]\nnorm_eps = 1e-2\n", "t.toml", {});
  EXPECT_EQ(fine.model.norm_eps, 1e-12);
  EXPECT_EQ(coarse.model.norm_eps, 1e-2);
  const std::vector<float> a = normalised_tiny_row(fine.model.norm_eps);
  const std::vector<float> b = normalised_tiny_row(coarse.model.norm_eps);
  // mean(x²) = 3.75e-8: eps 1e-12 leaves the row's own scale (x / 1.94e-4), eps 1e-2 flattens it ~500 times.
  const double rms = std::sqrt(3.75e-8);
  EXPECT_NEAR(a[0], 1e-4 / std::sqrt(rms * rms + 1e-12), 1e-6);
  EXPECT_NEAR(b[0], 1e-4 / std::sqrt(rms * rms + double(1e-2f)), 1e-9);
  EXPECT_GT(std::abs(a[0]), 100 * std::abs(b[0]));
  // Through --set as well.
  const Config set = load_config_text("", "t.toml", {"model.norm_eps=1e-2"});
  EXPECT_EQ(normalised_tiny_row(set.model.norm_eps), b);
}

TEST(RouterNormEps, ComesFromConfigJsonUnlessModelSetsIt) {
  const test::TempDir dir("moed_norm_eps");
  const ModelDims dims{2, 8, 2, 64, 32, 1e-12};
  const ModelSpec spec = synthetic_spec({Family::mixtral, 0, 0, -1, 0}, dims);
  dir.write("config.json", hf_config_json(spec, dims));
  const std::string model = "[model]\nweights = \"" + dir.path().string() + "\"\n";
  EXPECT_EQ(load_config_text(model, "t.toml", {}).model.norm_eps, 1e-12);
  EXPECT_EQ(load_config_text(model + "norm_eps = 1e-2\n", "t.toml", {}).model.norm_eps, 1e-2);
  for (float v : normalised_tiny_row(1e-12)) EXPECT_TRUE(std::isfinite(v));
}

}  // namespace
}  // namespace moed::runtime
