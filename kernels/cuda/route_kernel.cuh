// The GPU route stage's warp bodies: one warp normalises one row, and one
// routes one token (kernels/cuda/router.cu launches them). A header of their
// own so that a host test can also compile them under an emulated warp of 32
// threads (tests/unit/runtime/router/test_gpu_router_emulated.cc) and hold
// them to kernels::rms_norm and runtime::route where no GPU is. Of CUDA they
// use only lane exchanges and a warp barrier, through warp_shfl_xor,
// warp_shfl and warp_sync, which that test defines before including this.
#pragma once

#include <cmath>
#include <cstddef>

#include "kernels/cpu/router_body.h"

#if defined(__CUDACC__)
#define MOED_WARP_FUNCTION __device__ inline
#else
#define MOED_WARP_FUNCTION inline
#endif

namespace moed::cuda::route_detail {

#if defined(__CUDACC__)
constexpr unsigned kFullMask = 0xffffffffu;
__device__ inline void warp_sync() { __syncwarp(); }
template <class T>
__device__ inline T warp_shfl_xor(T value, int lane_mask) {
  return __shfl_xor_sync(kFullMask, value, lane_mask);
}
template <class T>
__device__ inline T warp_shfl(T value, int from_lane) {
  return __shfl_sync(kFullMask, value, from_lane);
}
#endif

// RMSNorm of one row with kernels::rms_norm's bits: the squares (exact in
// double) summed in column order, 32 columns at a time broadcast to every
// lane, which adds them in order (so every lane holds the CPU's sum); then
// the CPU's expressions, its eps = 0 branch included. out may alias x: a
// lane writes only the columns it read, after the whole sum.
MOED_WARP_FUNCTION void rms_norm_row(int lane, const float* x, const float* weight, int hidden, float eps,
                                     float* out) {
  double sum_of_squares = 0;
  for (int base = 0; base < hidden; base += 32) {
    const double v = base + lane < hidden ? double(x[base + lane]) : 0.0;
    const double square = v * v;
    const int n = hidden - base < 32 ? hidden - base : 32;
    for (int j = 0; j < n; ++j) sum_of_squares += warp_shfl(square, j);
  }
  const double mean_square = sum_of_squares / double(hidden);
  const double inv_double = 1.0 / sqrt(mean_square + double(eps));
  const float inv = float(inv_double);
  if (inv > 3.40282347e+38f) {  // inf: only with eps 0 (rms_norm.cc says why)
    for (int i = lane; i < hidden; i += 32)
      out[i] = mean_square == 0 ? x[i] * 0.0f * weight[i] : float(double(x[i]) * inv_double * double(weight[i]));
    return;
  }
  for (int i = lane; i < hidden; i += 32) out[i] = x[i] * inv * weight[i];
}

constexpr unsigned kNone = 0xffffffffu;  // no candidate: ranks after every real one

using kernels::detail::ranks_before;

// The best of the candidates across the warp, by ranks_before (a strict total
// order on distinct ids, so every lane ends with the same winner whatever the
// order of the comparisons). Each lane offers its own best (id kNone: none).
MOED_WARP_FUNCTION unsigned warp_best(double score, unsigned id) {
  for (int offset = 16; offset > 0; offset >>= 1) {
    const double other_score = warp_shfl_xor(score, offset);
    const unsigned other_id = warp_shfl_xor(id, offset);
    if (other_id != kNone && (id == kNone || ranks_before(other_score, other_id, score, id))) {
      score = other_score;
      id = other_id;
    }
  }
  return id;
}

// The softmax of a row's logits (plus `adj`, when not null) into out[E], as
// runtime/router/router.cc's softmax: in double, the maximum subtracted (the
// first value if it is NaN, as max_element leaves it), summed in id order by
// every lane (the same bits everywhere), each term then divided by the sum.
MOED_WARP_FUNCTION void softmax_row(int lane, const float* row, const double* adj, int E, double T, double* out) {
  auto value = [&](int e) { return adj ? double(row[e]) + adj[e] : double(row[e]); };
  double greatest = -HUGE_VAL;
  for (int e = lane; e < E; e += 32)
    if (greatest < value(e)) greatest = value(e);
  for (int offset = 16; offset > 0; offset >>= 1) {
    const double other = warp_shfl_xor(greatest, offset);
    if (greatest < other) greatest = other;
  }
  const double first = value(0);
  const double row_max = first != first ? first : greatest;
  for (int e = lane; e < E; e += 32) out[e] = kernels::detail::softmax_term(value(e), row_max, T);
  warp_sync();
  double sum = 0;
  for (int e = 0; e < E; ++e) sum += out[e];
  warp_sync();
  for (int e = lane; e < E; e += 32) out[e] = out[e] / sum;
  warp_sync();
}

// Candidate states in shared memory.
constexpr unsigned char kClosed = 0, kOpen = 1, kTaken = 2;

// Lane `lane` of the warp that routes `token`, with `shared` its block's
// shared memory (route_shared_bytes). Every step is runtime/router/router.cc's
// (rank_experts, then choose) in the same order, from the same element
// functions (kernels/cpu/router_body.h): the scores and their sums in id
// order, the groups by their two best, then the experts one at a time.
// `adjust` ([tokens, experts], or null) is the router policies' selection
// adjustment, as rank_experts takes it.
MOED_WARP_FUNCTION void route_token(int lane, long long token, double* shared, const float* logits, int experts,
                                   const kernels::RouteRule& rule, const float* bias, const double* adjust,
                                   int width, int* expert_ids, float* weights, int* counts) {
  const int E = experts, G = rule.groups;
  double* prob = shared;
  double* selection = prob + E;
  double* group_scores = selection + E;
  double* chosen_prob = group_scores + G;
  int* chosen_id = reinterpret_cast<int*>(chosen_prob + width);
  unsigned char* state = reinterpret_cast<unsigned char*>(chosen_id + width);
  const float* row = logits + token * E;
  const double* adj = adjust ? adjust + token * E : nullptr;
  const double T = rule.temperature;

  if (rule.sigmoid) {
    for (int e = lane; e < E; e += 32) {
      const double p = kernels::detail::sigmoid_score(double(row[e]), T);
      prob[e] = p;
      selection[e] = p + (bias ? double(bias[e]) : 0.0) + (adj ? adj[e] : 0.0);
    }
  } else {
    // The scores; the selection: the softmax of the adjusted logits, or the scores.
    softmax_row(lane, row, nullptr, E, T, prob);
    if (adj) softmax_row(lane, row, adj, E, T, selection);
    for (int e = lane; e < E; e += 32) {
      const double chosen_by = adj ? selection[e] : prob[e];
      selection[e] = bias ? chosen_by + double(bias[e]) : chosen_by;
    }
  }
  warp_sync();

  // Group-limited selection: only the experts of the groups_kept best groups stay open.
  int selectable = E;
  if (G > 1) {
    const int per = E / G;
    for (int g = lane; g < G; g += 32) {
      double best = -HUGE_VAL, second = -HUGE_VAL;
      for (int e = g * per; e < (g + 1) * per; ++e) kernels::detail::keep_best_two(selection[e], best, second);
      group_scores[g] = kernels::detail::group_score(best, second, bias != nullptr);
    }
    for (int e = lane; e < E; e += 32) state[e] = kClosed;
    warp_sync();
    for (int round = 0; round < rule.groups_kept; ++round) {
      double best_score = 0;
      unsigned best_group = kNone;
      for (int g = lane; g < G; g += 32)
        if (state[g * per] == kClosed &&
            (best_group == kNone || ranks_before(group_scores[g], unsigned(g), best_score, best_group))) {
          best_score = group_scores[g];
          best_group = unsigned(g);
        }
      const unsigned kept = warp_best(best_score, best_group);
      warp_sync();  // every lane's reads of state[] before its writes (a shuffle orders no memory)
      for (int e = int(kept) * per + lane; e < int(kept + 1) * per; e += 32) state[e] = kOpen;
      warp_sync();
    }
    selectable = per * rule.groups_kept;
  } else {
    for (int e = lane; e < E; e += 32) state[e] = kOpen;
    warp_sync();
  }

  // The experts one at a time, best first: top-k's k, or until top-p's mass.
  const int max_k = rule.top_p_mode ? (rule.max_k < selectable ? rule.max_k : selectable) : rule.top_k;
  double mass = 0;
  int k = 0;
  while (k < max_k && (!rule.top_p_mode || k < rule.min_k || mass < rule.top_p)) {
    double best_score = 0;
    unsigned best = kNone;
    for (int e = lane; e < E; e += 32)
      if (state[e] == kOpen && (best == kNone || ranks_before(selection[e], unsigned(e), best_score, best))) {
        best_score = selection[e];
        best = unsigned(e);
      }
    const unsigned chosen = warp_best(best_score, best);
    warp_sync();  // as above
    if (lane == 0) {
      state[chosen] = kTaken;
      chosen_id[k] = int(chosen);
      chosen_prob[k] = prob[chosen];
    }
    mass += selection[chosen];
    ++k;
    warp_sync();
  }

  double chosen_sum = 0;  // in rank order, as add_weights sums
  for (int i = 0; i < k; ++i) chosen_sum += chosen_prob[i];
  for (int i = lane; i < width; i += 32) {
    const bool chosen = i < k;
    expert_ids[token * width + i] = chosen ? chosen_id[i] : -1;
    weights[token * width + i] =
        chosen ? kernels::detail::route_weight(chosen_prob[i], chosen_sum, rule.renormalize, rule.scaling) : 0.0f;
  }
  if (lane == 0) counts[token] = k;
}

inline std::size_t route_shared_bytes(int experts, int groups, int width) {
  return sizeof(double) * (2 * std::size_t(experts) + std::size_t(groups) + std::size_t(width)) +
         sizeof(int) * std::size_t(width) + std::size_t(experts);
}

}  // namespace moed::cuda::route_detail
