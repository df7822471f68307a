#include "runtime/router/router.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "common/error.h"

namespace moed::runtime {

RouterParams RouterParams::from(const Config& c) {
  RouterParams p;
  p.top_p_mode = c.router.mode == RouterMode::topp;
  p.top_k = int(c.model.top_k);
  p.temperature = float(c.router.temperature);
  p.top_p = float(c.router.top_p);
  p.min_k = int(c.router.min_k);
  p.max_k = int(c.router.max_k ? c.router.max_k : c.model.top_k);
  return p;
}

void route(const float* logits, std::size_t tokens, std::size_t experts, const RouterParams& params,
           Routing& out) {
  Ranked ranked;
  rank_experts(logits, nullptr, tokens, experts, params, 0, ranked);
  choose(ranked, out);
}

namespace {

// Softmax in double with the max subtracted; the same sequence for every token.
void softmax(const double* logits, std::size_t experts, double temperature, double* prob) {
  const double mx = *std::max_element(logits, logits + experts);
  double sum = 0;
  for (std::size_t e = 0; e < experts; ++e) sum += prob[e] = std::exp((logits[e] - mx) / temperature);
  for (std::size_t e = 0; e < experts; ++e) prob[e] /= sum;
}

}  // namespace

void rank_experts(const float* logits, const double* adjust, std::size_t tokens, std::size_t experts,
                  const RouterParams& params, std::size_t extra, Ranked& out) {
  MOED_CHECK(params.top_k >= 1 && std::size_t(params.top_k) <= experts, "top_k {} of {} experts",
             params.top_k, experts);
  std::vector<double> l(experts), prob(experts), selection(experts);
  std::vector<std::uint32_t> order(experts);
  for (std::size_t t = 0; t < tokens; ++t) {
    for (std::size_t e = 0; e < experts; ++e) l[e] = double(logits[t * experts + e]);
    softmax(l.data(), experts, params.temperature, prob.data());
    if (adjust) {
      for (std::size_t e = 0; e < experts; ++e) l[e] += adjust[t * experts + e];
      softmax(l.data(), experts, params.temperature, selection.data());
    }
    const std::vector<double>& score = adjust ? selection : prob;

    std::iota(order.begin(), order.end(), 0u);
    auto by_score = [&](std::uint32_t a, std::uint32_t b) {
      return score[a] > score[b] || (score[a] == score[b] && a < b);
    };
    std::size_t k;
    const std::size_t max_k = params.top_p_mode ? std::min<std::size_t>(params.max_k, experts) : std::size_t(params.top_k);
    const std::size_t kept = std::min(experts, max_k + extra);
    std::partial_sort(order.begin(), order.begin() + std::ptrdiff_t(kept), order.end(), by_score);
    if (!params.top_p_mode) {
      k = max_k;
    } else {
      double mass = 0;
      k = 0;
      while (k < max_k && (k < std::size_t(params.min_k) || mass < params.top_p)) mass += score[order[k++]];
    }
    for (std::size_t i = 0; i < std::min(experts, k + extra); ++i) {
      out.experts.push_back(order[i]);
      out.probs.push_back(prob[order[i]]);
    }
    out.end_token(std::uint32_t(k));
  }
}

void add_renormalised(std::span<const std::uint32_t> experts, std::span<const double> probs, Routing& out) {
  double chosen = 0;
  for (double p : probs) chosen += p;
  for (std::size_t i = 0; i < experts.size(); ++i) out.add(experts[i], float(probs[i] / chosen));
}

void choose(const Ranked& ranked, Routing& out) {
  for (std::size_t t = 0; t < ranked.tokens(); ++t) {
    const std::size_t k = ranked.chosen[t];
    add_renormalised(ranked.experts_of(t).first(k), ranked.probs_of(t).first(k), out);
    out.end_token();
  }
}

}  // namespace moed::runtime
