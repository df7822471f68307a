// Expert choice from gate logits, one router for every model family (its
// RouterSpec, runtime/config/model_family.h): scores by softmax (with
// temperature) or sigmoid, a selection-only bias, group-limited selection,
// top-k or top-p with min/max k, and the chosen scores renormalised (or not)
// and scaled. Pure and deterministic: ties go to the lower expert id (and
// the lower group id), a NaN score ranks below every number, and a token's
// choice depends on its logits alone.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "runtime/config/config.h"

namespace moed::kernels {
struct RouteRule;  // kernels/cpu/router_body.h
}

namespace moed::runtime {

// Experts and gate weights per token, in compressed rows (one row per token).
struct Routing {
  std::vector<std::uint32_t> offsets{0};  // tokens + 1
  std::vector<std::uint32_t> experts;
  std::vector<float> weights;

  std::size_t tokens() const { return offsets.size() - 1; }
  std::size_t pairs() const { return experts.size(); }
  std::span<const std::uint32_t> experts_of(std::size_t t) const {
    return {experts.data() + offsets[t], offsets[t + 1] - offsets[t]};
  }
  std::span<const float> weights_of(std::size_t t) const {
    return {weights.data() + offsets[t], offsets[t + 1] - offsets[t]};
  }
  void clear() {
    offsets.assign(1, 0);
    experts.clear();
    weights.clear();
  }
  void add(std::uint32_t expert, float weight) {
    experts.push_back(expert);
    weights.push_back(weight);
  }
  void end_token() { offsets.push_back(std::uint32_t(experts.size())); }
};

// A token's request identity: which request it belongs to, and its position
// there (router policies keep a request's history by it).
struct TokenTag {
  std::uint64_t request = 0;
  std::uint32_t position = 0;
};

struct RouterParams {
  bool top_p_mode = false;
  int top_k = 2;
  float temperature = 1.0f;
  float top_p = 1.0f;
  int min_k = 1, max_k = 2;
  RouterSpec spec;  // the family's scoring, groups, renormalisation and scaling
  // The layer's selection bias (DeepSeek-V3's e_score_correction_bias),
  // [experts], or null; at_layer() sets it.
  const float* selection_bias = nullptr;

  static RouterParams from(const Config& c);
  // The same, in the plain numbers the GPU's router takes (kernels/cpu/router_body.h).
  kernels::RouteRule rule() const;
  RouterParams at_layer(const std::vector<float>& bias) const {
    RouterParams p = *this;
    p.selection_bias = bias.empty() ? nullptr : bias.data();
    return p;
  }
};

// Appends one row per token of logits[tokens, experts] to `out`; each row is
// ordered by descending probability.
void route(const float* logits, std::size_t tokens, std::size_t experts, const RouterParams& params,
           Routing& out);

// Each token's experts ranked by selection score, the router's choice first,
// then the next-ranked candidates; with the gate's own probabilities, which
// selection adjustments (router policies) never change.
struct Ranked {
  std::vector<std::uint32_t> offsets{0};  // tokens + 1
  std::vector<std::uint32_t> experts;
  std::vector<double> probs;
  std::vector<std::uint32_t> chosen;  // per token: its first `chosen` candidates are the router's choice

  std::size_t tokens() const { return chosen.size(); }
  std::span<const std::uint32_t> experts_of(std::size_t t) const {
    return {experts.data() + offsets[t], offsets[t + 1] - offsets[t]};
  }
  std::span<const double> probs_of(std::size_t t) const {
    return {probs.data() + offsets[t], offsets[t + 1] - offsets[t]};
  }
  void clear() {
    offsets.assign(1, 0);
    experts.clear();
    probs.clear();
    chosen.clear();
  }
  void end_token(std::uint32_t k) {
    chosen.push_back(k);
    offsets.push_back(std::uint32_t(experts.size()));
  }
};

// Ranks the experts of every token of logits[tokens, experts] (the gate's,
// router bias included). The score s is softmax(l / temperature) or
// sigmoid(l / temperature); the selection (order, and top-p's count) uses
//   softmax: the softmax of l + adjust (adjust[t * experts + e], the router
//            policies' bias; may be null: none), plus the selection bias;
//   sigmoid: s + the selection bias + adjust, so that the balancing bias is
//            added to DeepSeek's own e_score_correction_bias, not a second one.
// With groups, only the experts of the groups_kept best groups (a group's
// score: the sum of its top-2 selection scores with a selection bias, else
// its best) can be chosen or be candidates. The scores kept are the unbiased
// s. `extra` next-ranked candidates are kept beyond the choice (as many as
// there are selectable experts left). Appends to `out`.
void rank_experts(const float* logits, const double* adjust, std::size_t tokens, std::size_t experts,
                  const RouterParams& params, std::size_t extra, Ranked& out);
// The choice of every token of `ranked`, with its weights (add_weights)
// (route() is rank_experts without adjustment, then this).
void choose(const Ranked& ranked, const RouterSpec& spec, Routing& out);
// One row's weights from its scores: renormalised over the row (summed in
// its order) when spec.renormalize or spec.softmax_after_topk, then times spec.scaling. gpt-oss's
// softmax over the chosen logits is this too: the softmax of all the
// logits renormalised over the chosen ones.
void add_weights(std::span<const std::uint32_t> experts, std::span<const double> scores, const RouterSpec& spec,
                 Routing& out);

}  // namespace moed::runtime
