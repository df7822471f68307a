#include "runtime/router.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "common/error.h"

namespace moed::runtime {

RouterParams RouterParams::from(const Config& c) {
  RouterParams p;
  p.top_p_mode = c.router.mode == "topp";
  p.top_k = int(c.model.top_k);
  p.temperature = float(c.router.temperature);
  p.top_p = float(c.router.top_p);
  p.min_k = int(c.router.min_k);
  p.max_k = int(c.router.max_k ? c.router.max_k : c.model.top_k);
  return p;
}

void route(const float* logits, std::size_t tokens, std::size_t experts, const RouterParams& params,
           Routing& out) {
  MOED_CHECK(params.top_k >= 1 && std::size_t(params.top_k) <= experts, "top_k {} of {} experts",
             params.top_k, experts);
  std::vector<double> prob(experts);
  std::vector<std::uint32_t> order(experts);
  for (std::size_t t = 0; t < tokens; ++t) {
    const float* l = logits + t * experts;
    // Softmax in double with the max subtracted; the same sequence for every token.
    double mx = *std::max_element(l, l + experts);
    double sum = 0;
    for (std::size_t e = 0; e < experts; ++e) sum += prob[e] = std::exp((double(l[e]) - mx) / params.temperature);
    for (std::size_t e = 0; e < experts; ++e) prob[e] /= sum;

    std::iota(order.begin(), order.end(), 0u);
    auto by_prob = [&](std::uint32_t a, std::uint32_t b) {
      return prob[a] > prob[b] || (prob[a] == prob[b] && a < b);
    };
    std::size_t k;
    if (!params.top_p_mode) {
      k = std::size_t(params.top_k);
      std::partial_sort(order.begin(), order.begin() + k, order.end(), by_prob);
    } else {
      std::size_t max_k = std::min<std::size_t>(params.max_k, experts);
      std::partial_sort(order.begin(), order.begin() + max_k, order.end(), by_prob);
      double mass = 0;
      k = 0;
      while (k < max_k && (k < std::size_t(params.min_k) || mass < params.top_p)) mass += prob[order[k++]];
    }
    double chosen = 0;
    for (std::size_t i = 0; i < k; ++i) chosen += prob[order[i]];
    for (std::size_t i = 0; i < k; ++i) out.add(order[i], float(prob[order[i]] / chosen));
    out.end_token();
  }
}

}  // namespace moed::runtime
