#include "runtime/router/router.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "common/error.h"
#include "kernels/cpu/router_body.h"

namespace moed::runtime {

RouterParams RouterParams::from(const Config& c) {
  RouterParams p;
  p.top_p_mode = c.router.mode == RouterMode::topp;
  p.top_k = int(c.model.top_k);
  p.temperature = float(c.router.temperature);
  p.top_p = float(c.router.top_p);
  p.min_k = int(c.router.min_k);
  p.max_k = int(c.router.max_k ? c.router.max_k : c.model.top_k);
  p.spec = model_spec(c.model).router;
  return p;
}

kernels::RouteRule RouterParams::rule() const {
  kernels::RouteRule r;
  r.sigmoid = spec.scoring == Scoring::sigmoid;
  r.top_p_mode = top_p_mode;
  r.top_k = top_k;
  r.min_k = min_k;
  r.max_k = max_k;
  r.temperature = temperature;
  r.top_p = top_p;
  r.groups = spec.groups;
  r.groups_kept = spec.groups_kept;
  r.renormalize = spec.renormalize || spec.softmax_after_topk;
  r.scaling = spec.scaling;
  return r;
}

void route(const float* logits, std::size_t tokens, std::size_t experts, const RouterParams& params,
           Routing& out) {
  Ranked ranked;
  rank_experts(logits, nullptr, tokens, experts, params, 0, ranked);
  choose(ranked, params.spec, out);
}

namespace {

using kernels::detail::ranks_before;

// Softmax in double with the max subtracted (the first logit if it is NaN,
// as max_element leaves it), summed in id order; the same sequence for every
// token, and on the GPU (kernels/cuda/router.cu).
void softmax(const double* logits, std::size_t experts, double temperature, double* prob) {
  const double mx = *std::max_element(logits, logits + experts);
  double sum = 0;
  for (std::size_t e = 0; e < experts; ++e) sum += prob[e] = kernels::detail::softmax_term(logits[e], mx, temperature);
  for (std::size_t e = 0; e < experts; ++e) prob[e] /= sum;
}

// Marks the experts of the groups_kept best groups selectable (DeepSeek's
// group-limited routing): a group scores the sum of its two best selection
// scores when the router has a selection bias, else its best; groups rank
// as experts do (ties to the lower id, NaN last).
void keep_best_groups(const std::vector<double>& selection, const RouterSpec& spec, bool top2,
                      std::vector<double>& group_score, std::vector<std::uint32_t>& group_order,
                      std::vector<char>& selectable) {
  const std::size_t G = std::size_t(spec.groups), per = selection.size() / G;
  for (std::size_t g = 0; g < G; ++g) {
    double best = -HUGE_VAL, second = -HUGE_VAL;
    for (std::size_t e = g * per; e < (g + 1) * per; ++e) kernels::detail::keep_best_two(selection[e], best, second);
    group_score[g] = kernels::detail::group_score(best, second, top2);
  }
  std::iota(group_order.begin(), group_order.end(), 0u);
  std::partial_sort(group_order.begin(), group_order.begin() + spec.groups_kept, group_order.end(),
                    [&](std::uint32_t a, std::uint32_t b) { return ranks_before(group_score[a], a, group_score[b], b); });
  std::fill(selectable.begin(), selectable.end(), 0);
  for (int i = 0; i < spec.groups_kept; ++i)
    std::fill_n(selectable.begin() + std::ptrdiff_t(group_order[std::size_t(i)] * per), per, 1);
}

}  // namespace

void rank_experts(const float* logits, const double* adjust, std::size_t tokens, std::size_t experts,
                  const RouterParams& params, std::size_t extra, Ranked& out) {
  const RouterSpec& spec = params.spec;
  MOED_CHECK(params.top_k >= 1 && std::size_t(params.top_k) <= experts, "top_k {} of {} experts",
             params.top_k, experts);
  MOED_CHECK(spec.groups >= 1 && experts % std::size_t(spec.groups) == 0 && spec.groups_kept >= 1 &&
                 spec.groups_kept <= spec.groups,
             "{} of {} groups over {} experts", spec.groups_kept, spec.groups, experts);
  const bool sigmoid = spec.scoring == Scoring::sigmoid, grouped = spec.groups > 1;
  const float* bias = params.selection_bias;
  std::vector<double> l(experts), prob(experts), selection(experts), group_score(std::size_t(spec.groups));
  std::vector<std::uint32_t> order(experts), group_order(std::size_t(spec.groups));
  std::vector<char> selectable(experts, 1);
  for (std::size_t t = 0; t < tokens; ++t) {
    for (std::size_t e = 0; e < experts; ++e) l[e] = double(logits[t * experts + e]);
    const double* adj = adjust ? adjust + t * experts : nullptr;
    if (sigmoid) {
      for (std::size_t e = 0; e < experts; ++e) prob[e] = kernels::detail::sigmoid_score(l[e], params.temperature);
      for (std::size_t e = 0; e < experts; ++e)
        selection[e] = prob[e] + (bias ? double(bias[e]) : 0.0) + (adj ? adj[e] : 0.0);
    } else {
      softmax(l.data(), experts, params.temperature, prob.data());
      if (adj) {
        for (std::size_t e = 0; e < experts; ++e) l[e] += adj[e];
        softmax(l.data(), experts, params.temperature, selection.data());
      } else {
        selection = prob;
      }
      if (bias)
        for (std::size_t e = 0; e < experts; ++e) selection[e] += double(bias[e]);
    }
    if (grouped) keep_best_groups(selection, spec, bias != nullptr, group_score, group_order, selectable);

    // The selectable experts first, in id order, then ranked by selection
    // score (ties: the lower id). Written in place: no allocation per token.
    std::size_t n_first = 0;
    for (std::uint32_t e = 0; e < experts; ++e)
      if (selectable[e]) order[n_first++] = e;
    for (std::uint32_t e = 0, rest = std::uint32_t(n_first); e < experts; ++e)
      if (!selectable[e]) order[rest++] = e;
    const auto selectable_end = order.begin() + std::ptrdiff_t(n_first);
    const std::size_t n_selectable = std::size_t(selectable_end - order.begin());
    // A NaN score (a NaN logit; every softmax score of a row holding NaN or
    // +inf) ranks below every number, NaNs tied: the order stays strict and
    // weak, so such a row is ranked as defined (an all-NaN row takes the
    // lowest ids), not as the sort happens to leave it. keep_best_groups
    // skips NaN alike. Rows without NaN rank exactly as before.
    auto by_score = [&](std::uint32_t a, std::uint32_t b) { return ranks_before(selection[a], a, selection[b], b); };
    std::size_t k;
    const std::size_t max_k =
        params.top_p_mode ? std::min<std::size_t>(params.max_k, n_selectable) : std::size_t(params.top_k);
    MOED_CHECK(max_k <= n_selectable, "top_k {} exceeds the {} experts of the kept groups", max_k, n_selectable);
    const std::size_t kept = std::min(n_selectable, max_k + extra);
    std::partial_sort(order.begin(), order.begin() + std::ptrdiff_t(kept), selectable_end, by_score);
    if (!params.top_p_mode) {
      k = max_k;
    } else {
      double mass = 0;
      k = 0;
      while (k < max_k && (k < std::size_t(params.min_k) || mass < params.top_p)) mass += selection[order[k++]];
    }
    for (std::size_t i = 0; i < std::min(n_selectable, k + extra); ++i) {
      out.experts.push_back(order[i]);
      out.probs.push_back(prob[order[i]]);
    }
    out.end_token(std::uint32_t(k));
  }
}

void add_weights(std::span<const std::uint32_t> experts, std::span<const double> scores, const RouterSpec& spec,
                 Routing& out) {
  double chosen = 0;
  for (double p : scores) chosen += p;
  // softmax_after_topk: the softmax over the chosen logits is the full
  // softmax renormalised over them.
  const bool renormalize = spec.renormalize || spec.softmax_after_topk;
  for (std::size_t i = 0; i < experts.size(); ++i)
    out.add(experts[i], kernels::detail::route_weight(scores[i], chosen, renormalize, spec.scaling));
}

void choose(const Ranked& ranked, const RouterSpec& spec, Routing& out) {
  for (std::size_t t = 0; t < ranked.tokens(); ++t) {
    const std::size_t k = ranked.chosen[t];
    add_weights(ranked.experts_of(t).first(k), ranked.probs_of(t).first(k), spec, out);
    out.end_token();
  }
}

}  // namespace moed::runtime
