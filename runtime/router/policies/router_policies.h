// The router policies of one rank (docs/router-policies.md), each off by
// default: smoothing (a selection bonus for the experts the request's
// previous position chose), a load policy (drop or demote, load_policy.h),
// online bias balancing (bias_balancer.h) and the jitter measurement.
//
// The engine asks it for each layer's selection adjustments before ranking
// its own tokens; when a policy needs the whole step (a load policy, or a
// request's history, which must not depend on which rank serves a request's
// next position), every rank all-gathers every token's candidates and
// decide() makes the same decision on each, in the canonical order of the
// step's tokens (rank order, then each rank's order: the step's positions).
// No transport here: the engine gathers, this decides.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "runtime/config/config.h"
#include "runtime/router/router.h"
#include "runtime/router/policies/bias_balancer.h"
#include "runtime/router/policies/candidate_records.h"
#include "runtime/router/policies/load_policy.h"
#include "runtime/router/policies/request_history.h"

namespace moed::runtime {

// What the policies did and measured, over the tokens a rank counts (its
// own); all sums, so ranks add up.
struct RouterCounters {
  std::uint64_t tokens = 0, pairs = 0, moved = 0, dropped = 0;  // tokens and pairs the load policy saw
  std::uint64_t weight_moved = 0, weight_dropped = 0;  // gate weight, units of 2^-32 (kWeightUnit)
  std::uint64_t flip_tested = 0, flipped = 0;           // tokens whose request's previous position was known
  std::uint64_t jitter_tested = 0;
  std::array<std::uint64_t, 2> jitter_changed{};  // per kJitterEps
  // With bias balancing or a load policy: the pairs of the router's own
  // selection (no bias, no load policy), and those the final routing lacks.
  std::uint64_t selected = 0, changed = 0;

  // Every field as a word, in order (what ranks sum, and add() sums).
  static constexpr std::size_t kWords = 13;
  std::array<std::uint64_t, kWords> words() const;
  static RouterCounters from_words(std::span<const std::uint64_t> w);
  void add(const RouterCounters& o);
};
// A field added above without a word in words() and from_words() would be
// dropped by every sum over ranks: the size says when kWords is stale.
static_assert(sizeof(RouterCounters) == RouterCounters::kWords * sizeof(std::uint64_t),
              "RouterCounters: a field is missing from kWords, words() and from_words()");

// "smoothing beta 0.5, demote at 0.85 of capacity 1.25, bias gamma 0.001, jitter
// measured"; empty when every policy is off.
std::string describe_router_policies(const Config& config);

// Pairs of `plain` (token t, expert e) with e not among `final`'s experts of
// token t: what the balancing policies changed, whichever way (a bias's other
// choice, a demotion, a drop). The two hold the same tokens.
std::uint64_t lost_pairs(const Routing& plain, const Routing& final);

class RouterPolicies {
 public:
  RouterPolicies(const Config& config, int layers, int experts);

  bool adjusts() const { return beta_ > 0 || bias_.has_value(); }
  // A policy needs every token of the step on every rank (the gather).
  bool shares_tokens() const { return load_.policy != LoadPolicy::none || history_.has_value(); }
  bool measures_jitter() const { return measure_jitter_; }
  // A policy changes what the plain router chooses, or needs the step's tokens: fixed by the config.
  bool acts() const { return adjusts() || shares_tokens(); }
  bool balances() const { return bias_.has_value(); }
  // Bias balancing or a load policy: the pairs they change are counted.
  bool rebalances() const { return balances() || load_.policy != LoadPolicy::none; }
  // Candidates per token beyond its choice (the demotion targets).
  std::size_t extra_candidates() const { return extra_; }
  // Room per token in the gather's records.
  std::size_t max_candidates() const { return max_candidates_; }

  // The selection adjustments of `layer` for tokens with these tags
  // ([tokens * experts] into `out`), or null when none applies; without the
  // bias when `with_bias` is false (the router's own selection, smoothed).
  const double* adjustments(int layer, std::span<const TokenTag> tags, std::vector<double>& out,
                            bool with_bias = true) const;

  // The step's decision at `layer`: `all` holds every token of the step in
  // canonical order (tags alike); [mine_first, mine_first + mine) are this
  // rank's, whose final routing is appended to `mine_out` and counted.
  void decide(int layer, const Ranked& all, std::span<const TokenTag> tags, std::size_t mine_first,
              std::size_t mine, std::span<const std::uint32_t> replicas, Routing& mine_out, RouterCounters& counters);
  // The job's loads of `layer` in this step (bias balancing). With a load
  // policy too, the biases follow the selection's loads before it (decide()
  // kept them): the bias balances the router's choice, the load policy trims
  // what is left, and the bias never chases loads the policy already capped.
  void end_layer(int layer, std::span<const std::uint64_t> load);
  // After every step that served a layer (the history's clock).
  void end_step();

  // Bias balancing's values, [layer * experts + e] (empty when off).
  std::vector<double> biases() const { return bias_ ? bias_->values() : std::vector<double>{}; }
  void set_biases(std::vector<double> values);
  std::size_t remembered_requests() const { return history_ ? history_->size() : 0; }

 private:
  int layers_, experts_;
  double beta_;
  LoadParams load_;
  bool measure_jitter_;
  std::size_t extra_ = 0, max_candidates_ = 0;
  std::optional<BiasBalancer> bias_;
  std::optional<RequestHistory> history_;  // with smoothing or the jitter measurement
  std::uint64_t steps_ = 0;
  Routing all_routing_;  // decide()'s buffer
  std::vector<std::uint64_t> selection_load_;  // the step's loads before the load policy, at selection_layer_
  int selection_layer_ = -1;
};

}  // namespace moed::runtime
