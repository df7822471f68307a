// Load policies of one layer's step, decided over every token of the step on
// every rank alike (docs/router-policies.md):
//
// - drop (DeepSpeed-MoE, Tutel): an expert takes at most its capacity,
//   capacity_factor x pairs / experts per replica; the pairs over it are
//   dropped and each token's surviving weights are renormalised (a token
//   with none left passes through: its output is its residual).
// - demote: an expert keeps at most threshold x its capacity; each pair over
//   it moves to its token's next-ranked candidate that is under its own
//   threshold (not one the token already has), weights renormalised over the
//   token's new experts; a pair with no such candidate stays where it was.
//
// Both keep the pairs with the highest gate weight: pairs are taken in order
// of weight (descending; a NaN weight last), then token (the canonical order
// of `all`), then rank within the token. Pure; the result depends only on its arguments, so
// every rank that holds the same step computes the same bits.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include "runtime/router/router.h"

namespace moed::runtime {

struct LoadParams {
  LoadPolicy policy = LoadPolicy::none;
  double capacity_factor = 1.25;
  double threshold = 0.85;  // demote only
  RouterSpec weights;       // how the final choice's scores become weights (add_weights)
  // demote only: > 0, each step's room comes from its own loads instead of
  // the capacity: the experts above the top of levels_for_spread(loads,
  // target_spread) demote their excess, to candidates under its floor first
  // (then to any under its top), so the step's expert loads come to about
  // this std/mean moving about the fewest pairs any re-routing could.
  double target_spread = 0;
};

// What the policy did to the pairs of the tokens counted (a range of them):
// gate weight in units of 2^-32 so that sums over ranks are exact.
struct LoadOutcome {
  std::uint64_t pairs = 0, moved = 0, dropped = 0;
  std::uint64_t weight_moved = 0, weight_dropped = 0;
};
inline constexpr double kWeightUnit = 4294967296.0;  // 2^32

// The final routing of every token of `all` (appended to `out`, one row per
// token). `replicas[e]`: the expert's replicas at this layer. The outcome
// counts tokens [counted_first, counted_first + counted).
LoadOutcome apply_load_policy(const Ranked& all, std::span<const std::uint32_t> replicas, const LoadParams& params,
                              std::size_t counted_first, std::size_t counted, Routing& out);

// An expert's room under the policy: capacity_factor x pairs / experts x
// replicas, times the threshold when demoting.
double expert_room(const LoadParams& params, std::uint64_t pairs, std::size_t experts, std::uint32_t replicas);

}  // namespace moed::runtime
