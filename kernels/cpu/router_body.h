// The router's arithmetic, one IEEE operation per step, shared by the CPU
// router (runtime/router/router.cc) and the GPU's (kernels/cuda/router.cu):
// the exponential, the scores, the ranking order, the group scores and the
// weights. With the same sums in the same order around them, both routers
// choose the same experts with the same weight bits. Neither may contract a
// multiply and an add into an fma: the CPU builds in ISO C++ mode
// (fp-contract off), the CUDA file with --fmad=false.
#pragma once

#include <cstdint>
#include <cstring>

#include "kernels/cpu/elementwise.h"

namespace moed::kernels {

// What a router computes for one layer, in plain numbers (the runtime's
// RouterParams and RouterSpec say where each comes from).
struct RouteRule {
  bool sigmoid = false;     // scores sigmoid(l / T), else softmax(l / T)
  bool top_p_mode = false;  // the fewest experts whose selection scores reach top_p (min_k..max_k)
  int top_k = 2, min_k = 1, max_k = 2;
  double temperature = 1.0, top_p = 1.0;
  int groups = 1, groups_kept = 1;  // group-limited selection (DeepSeek's n_group, topk_group)
  bool renormalize = true;          // the chosen scores divided by their sum
  double scaling = 1.0;             // then times this (routed_scaling_factor)
};

// How many experts a token may choose: top_k, or top-p's max_k capped at
// the experts of the kept groups.
MOED_ELEMENTWISE int route_width(const RouteRule& rule, long long experts) {
  const long long selectable = experts / rule.groups * rule.groups_kept;
  if (!rule.top_p_mode) return rule.top_k;
  return int(rule.max_k < selectable ? rule.max_k : selectable);
}

}  // namespace moed::kernels

namespace moed::kernels::detail {

// 2^e for a normal exponent e (-1022..1023), through the exponent bits.
MOED_ELEMENTWISE double power_of_two(int e) {
  const std::uint64_t bits = std::uint64_t(e + 1023) << 52;
  double v;
  std::memcpy(&v, &bits, sizeof v);
  return v;
}

// exp(x) in double from + - * / alone, so that the host and the device
// round it alike (their libraries' exp need not): x = n ln2 + r with
// |r| <= ln2 / 2 (ln2 in two parts, n ln2_hi exact), exp(r) by its Taylor
// polynomial of degree 13 (truncation below 1e-17 relative), times 2^n
// through the exponent bits. Relative error within a few units in the last
// place of glibc's; exactly 1 at 0, inf above ln(DBL_MAX), 0 below the
// least subnormal's half, NaN for NaN.
MOED_ELEMENTWISE double route_exp(double x) {
  if (x != x) return x + x;
  if (x > 709.782712893383973096) return __builtin_inf();
  if (x < -745.133219101941108420) return 0.0;
  // Adding 1.5 * 2^52 rounds x / ln2 to an integer, ties to even.
  const double shifter = 6755399441055744.0;
  const double n = (x * 1.4426950408889634074 + shifter) - shifter;
  double r = x - n * 6.93147180369123816490e-01;
  r = r - n * 1.90821492927058770002e-10;
  double p = 1.6059043836821613e-10;  // 1/13!
  p = p * r + 2.08767569878681e-09;
  p = p * r + 2.505210838544172e-08;
  p = p * r + 2.755731922398589e-07;
  p = p * r + 2.7557319223985893e-06;
  p = p * r + 2.48015873015873e-05;
  p = p * r + 0.0001984126984126984;
  p = p * r + 0.001388888888888889;
  p = p * r + 0.008333333333333333;
  p = p * r + 0.041666666666666664;
  p = p * r + 0.16666666666666666;
  p = p * r + 0.5;
  p = p * r + 1.0;
  p = p * r + 1.0;
  const int ni = int(n);  // -1075..1024
  if (ni > 1023) return p * 2.0 * power_of_two(ni - 1);
  // Below the normal range: scale exactly into it, then round once.
  if (ni < -1022) return p * power_of_two(ni + 54) * power_of_two(-54);
  return p * power_of_two(ni);
}

// A sigmoid router's score.
MOED_ELEMENTWISE double sigmoid_score(double logit, double temperature) {
  return 1.0 / (1.0 + route_exp(-logit / temperature));
}

// A softmax term before its division by the row's sum; `row_max` is the
// row's first logit if that is NaN, else its greatest number.
MOED_ELEMENTWISE double softmax_term(double logit, double row_max, double temperature) {
  return route_exp((logit - row_max) / temperature);
}

// The ranking: higher score first, ties to the lower id, and NaN below every
// number (NaNs tied, so by id). A strict total order on distinct ids: any
// selection method picks the same experts in the same order.
MOED_ELEMENTWISE bool ranks_before(double score_a, std::uint32_t a, double score_b, std::uint32_t b) {
  if (score_a > score_b) return true;
  if (score_a == score_b) return a < b;
  const bool a_nan = score_a != score_a, b_nan = score_b != score_b;
  return b_nan && (!a_nan || a < b);
}

// One step of a group's two best selection scores (NaN skipped), in id order.
MOED_ELEMENTWISE void keep_best_two(double score, double& best, double& second) {
  if (score > best) {
    second = best;
    best = score;
  } else if (score > second) {
    second = score;
  }
}

// A group's score: its two best summed when the router has a selection bias
// (DeepSeek-V3), else its best. Start from best = second = -inf.
MOED_ELEMENTWISE double group_score(double best, double second, bool top_two) {
  return top_two ? best + second : best;
}

// A chosen expert's weight from its score and the sum of the chosen scores
// (summed in rank order). A sum of 0 (every chosen sigmoid underflowed)
// divides by 1, as Hugging Face's DeepSeek-V3 (its sum + 1e-20) gives; a NaN
// sum stays NaN.
MOED_ELEMENTWISE float route_weight(double score, double chosen_sum, bool renormalize, double scaling) {
  const double divisor = renormalize && chosen_sum != 0 ? chosen_sum : 1.0;
  return float(score / divisor * scaling);
}

}  // namespace moed::kernels::detail
