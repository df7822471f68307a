#include "runtime/router/policies/load_policy.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "common/error.h"
#include "runtime/router/policies/spread_bound.h"

namespace moed::runtime {

double expert_room(const LoadParams& params, std::uint64_t pairs, std::size_t experts, std::uint32_t replicas) {
  const double capacity = params.capacity_factor * double(pairs) / double(experts) * double(replicas);
  return params.policy == LoadPolicy::demote ? capacity * params.threshold : capacity;
}

namespace {

struct Pair {
  double weight;  // the gate weight: the token's probability renormalised over its choice
  std::uint32_t token, slot;
};

// A chosen probability renormalised over its token's choice (`sum`); 0 when
// every chosen sigmoid underflowed to 0, as add_weights gives, not 0/0.
double gate_weight(double prob, double sum) { return sum != 0 ? prob / sum : prob; }

}  // namespace

LoadOutcome apply_load_policy(const Ranked& all, std::span<const std::uint32_t> replicas, const LoadParams& params,
                              std::size_t counted_first, std::size_t counted, Routing& out) {
  const std::size_t E = replicas.size(), T = all.tokens();
  MOED_CHECK(counted_first + counted <= T, "load policy: counting tokens [{}, {}) of {}", counted_first,
             counted_first + counted, T);
  LoadOutcome outcome;
  // Where each chosen pair ends: its candidate slot, or kDropped.
  constexpr std::uint32_t kDropped = UINT32_MAX;
  std::vector<std::uint32_t> first(T + 1, 0);
  for (std::size_t t = 0; t < T; ++t) first[t + 1] = first[t] + all.chosen[t];
  std::vector<std::uint32_t> fate(first[T]);
  std::vector<Pair> pairs;
  pairs.reserve(first[T]);
  for (std::size_t t = 0; t < T; ++t) {
    const auto probs = all.probs_of(t);
    double sum = 0;
    for (std::uint32_t i = 0; i < all.chosen[t]; ++i) sum += probs[i];
    for (std::uint32_t i = 0; i < all.chosen[t]; ++i) {
      pairs.push_back({gate_weight(probs[i], sum), std::uint32_t(t), i});
      fate[first[t] + i] = i;
    }
  }
  if (params.policy != LoadPolicy::none) {
    // A NaN weight (a row of NaN scores) goes after every number, NaNs tied:
    // NaN compares unordered with everything, which would leave std::sort
    // without a strict weak order (undefined, and the other rows' pairs
    // placed at random).
    std::sort(pairs.begin(), pairs.end(), [](const Pair& a, const Pair& b) {
      const bool a_nan = std::isnan(a.weight), b_nan = std::isnan(b.weight);
      if (a_nan != b_nan) return b_nan;
      if (!a_nan && a.weight != b.weight) return a.weight > b.weight;
      return a.token != b.token ? a.token < b.token : a.slot < b.slot;
    });
    std::vector<double> room(E);
    double floor = 0;  // with a target spread: the level the experts under it are filled to first
    if (params.policy == LoadPolicy::demote && params.target_spread > 0) {
      std::vector<double> chosen(E, 0.0);
      for (const Pair& p : pairs) {
        const std::uint32_t e = all.experts_of(p.token)[p.slot];
        MOED_CHECK(e < E, "load policy: expert {} of {}", e, E);
        chosen[e] += 1;
      }
      const SpreadLevels levels = levels_for_spread(chosen, params.target_spread);
      std::fill(room.begin(), room.end(), levels.top);
      floor = std::ceil(levels.floor);
    } else {
      for (std::size_t e = 0; e < E; ++e) room[e] = expert_room(params, pairs.size(), E, replicas[e]);
    }
    std::vector<std::uint64_t> load(E, 0);
    const auto fits = [&](std::uint32_t e) { return double(load[e] + 1) <= room[e]; };
    const auto needs = [&](std::uint32_t e) { return double(load[e] + 1) <= floor; };
    std::vector<const Pair*> over;
    for (const Pair& p : pairs) {
      const std::uint32_t e = all.experts_of(p.token)[p.slot];
      MOED_CHECK(e < E, "load policy: expert {} of {}", e, E);
      if (fits(e))
        ++load[e];
      else
        over.push_back(&p);
    }
    for (const Pair* p : over) {
      const auto experts = all.experts_of(p->token);
      std::uint32_t& f = fate[first[p->token] + p->slot];
      if (params.policy == LoadPolicy::drop) {
        f = kDropped;
        continue;
      }
      // The next-ranked candidate under its threshold that the token does not already use.
      const auto taken = [&](std::uint32_t e) {
        for (std::uint32_t i = 0; i < all.chosen[p->token]; ++i)
          if (fate[first[p->token] + i] != kDropped && experts[fate[first[p->token] + i]] == e) return true;
        return false;
      };
      // The next-ranked candidate that `open` takes; the pair's own slot if none.
      const auto first_open = [&](const auto& open) {
        for (std::uint32_t c = all.chosen[p->token]; c < experts.size(); ++c)
          if (!taken(experts[c]) && open(experts[c])) return c;
        return p->slot;
      };
      // With a target spread, an expert under the floor first (the flattest
      // loads fill those); else (and by capacity) the first with room.
      f = first_open(needs);
      if (f == p->slot) f = first_open(fits);
      ++load[experts[f]];
    }
  }
  std::vector<std::uint32_t> final_experts;
  std::vector<double> final_probs;
  for (std::size_t t = 0; t < T; ++t) {
    const auto experts = all.experts_of(t);
    const auto probs = all.probs_of(t);
    const bool counted_token = t >= counted_first && t < counted_first + counted;
    double sum = 0;
    for (std::uint32_t i = 0; i < all.chosen[t]; ++i) sum += probs[i];
    final_experts.clear();
    final_probs.clear();
    for (std::uint32_t i = 0; i < all.chosen[t]; ++i) {
      const std::uint32_t f = fate[first[t] + i];
      if (counted_token) {
        // A NaN weight counts 0 (llround of NaN is no number).
        const double share = gate_weight(probs[i], sum);
        const auto weight = std::isnan(share) ? std::uint64_t(0) : std::uint64_t(std::llround(share * kWeightUnit));
        ++outcome.pairs;
        if (f == kDropped) ++outcome.dropped, outcome.weight_dropped += weight;
        else if (f != i) ++outcome.moved, outcome.weight_moved += weight;
      }
      if (f == kDropped) continue;
      final_experts.push_back(experts[f]);
      final_probs.push_back(probs[f]);
    }
    add_weights(final_experts, final_probs, params.weights, out);
    out.end_token();
  }
  return outcome;
}

}  // namespace moed::runtime
