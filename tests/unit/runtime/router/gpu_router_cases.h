// The GPU router's test cases, shared by its test on a GPU
// (tests/unit/kernels_cuda/test_cuda_router.cc) and by the emulated warp's
// on the CPU (test_gpu_router_emulated.cc): every family's router, top-p,
// temperature, the selection bias and groups, ties and adversarial rows.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cmath>
#include <cstring>
#include <limits>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "runtime/config/model_family.h"
#include "runtime/router/router.h"

namespace moed::test {

using runtime::Family;
using runtime::RouterParams;
using runtime::Routing;

struct GpuRouterCase {
  const char* name;
  Family family;
  int experts, top_k, groups, groups_kept;
  bool top_p = false;
  float temperature = 1.0f;
};

inline RouterParams params_of(const GpuRouterCase& c) {
  RouterParams p;
  p.top_k = c.top_k;
  p.max_k = c.top_k;
  p.temperature = c.temperature;
  p.spec = runtime::synthetic_spec({c.family, c.groups, c.groups_kept, -1, 0}, {1, c.experts, c.top_k, 64, 32, 1e-5})
               .router;
  if (c.top_p) {
    p.top_p_mode = true;
    p.top_p = 0.6f;
    p.min_k = 2;
  }
  return p;
}

// Random logits quantised to eighths (many exact ties), then rows of every
// adversarial kind among them.
inline std::vector<float> logits_of(int tokens, int experts, unsigned seed) {
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> q(-40, 40);
  std::vector<float> l(std::size_t(tokens) * experts);
  for (float& v : l) v = float(q(rng)) / 8.0f;
  auto row = [&](int t) { return l.begin() + std::ptrdiff_t(t) * experts; };
  std::fill_n(row(1), experts, 0.25f);              // all equal: the lowest ids
  std::fill_n(row(2), experts, -inf);               // all -inf
  l[std::size_t(3) * experts] = nan;                // NaN first: max_element's NaN, every score NaN
  l[std::size_t(4) * experts + 5 % experts] = nan;  // NaN inside
  l[std::size_t(5) * experts + 7 % experts] = inf;  // one +inf
  std::fill_n(row(6), experts, 1e30f);
  std::fill_n(row(7), experts, -1e30f);  // sigmoid underflows to 0: weights 0, not NaN
  for (int e = 0; e < experts; ++e) l[std::size_t(8) * experts + e] = e % 2 ? -1e30f : 1e30f;
  std::fill_n(row(9), experts, nan);
  std::fill_n(row(10), experts, -0.0f);
  return l;
}

// A case's layer: its router, logits and selection bias, and what
// runtime::route chooses there; and router policies' selection adjustments
// with what rank_experts and choose make of them.
struct GpuRouterLayer {
  RouterParams params;
  std::vector<float> logits, bias;
  Routing expected;
  std::vector<double> adjust;
  Routing adjusted;
};

inline GpuRouterLayer layer_of(const GpuRouterCase& c, int tokens) {
  GpuRouterLayer layer;
  layer.params = params_of(c);
  layer.logits = logits_of(tokens, c.experts, unsigned(c.experts * 31 + c.top_k));
  RouterParams at_layer = layer.params;
  if (layer.params.spec.selection_bias) {
    std::mt19937 rng(5);
    std::uniform_real_distribution<float> b(-0.05f, 0.05f);
    layer.bias.resize(std::size_t(c.experts));
    for (float& v : layer.bias) v = b(rng);
    at_layer = layer.params.at_layer(layer.bias);
  }
  runtime::route(layer.logits.data(), std::size_t(tokens), std::size_t(c.experts), at_layer, layer.expected);
  // Adjustments as the balancing bias and smoothing make them (small, per
  // token and expert; a few rows without), on the same logits.
  std::mt19937 rng(11);
  std::uniform_int_distribution<int> a(-8, 8);
  layer.adjust.resize(layer.logits.size());
  for (std::size_t i = 0; i < layer.adjust.size(); ++i)
    layer.adjust[i] = i / std::size_t(c.experts) % 5 == 4 ? 0.0 : double(a(rng)) / 64.0;
  runtime::Ranked ranked;
  runtime::rank_experts(layer.logits.data(), layer.adjust.data(), std::size_t(tokens), std::size_t(c.experts),
                        at_layer, 0, ranked);
  runtime::choose(ranked, at_layer.spec, layer.adjusted);
  return layer;
}

// Holds ids, weights and counts ([tokens, width], -1 and 0 past a token's
// count) to runtime::route's choice, bit for bit (a NaN weight need only be
// NaN: a GPU may canonicalise its bits).
inline void expect_same_routing(const Routing& expected, int tokens, int width, const std::vector<int>& ids,
                                const std::vector<float>& weights, const std::vector<int>& counts) {
  for (int t = 0; t < tokens; ++t) {
    SCOPED_TRACE("token " + std::to_string(t));
    const auto want_ids = expected.experts_of(std::size_t(t));
    const auto want_weights = expected.weights_of(std::size_t(t));
    ASSERT_EQ(std::size_t(counts[std::size_t(t)]), want_ids.size());
    for (int i = 0; i < width; ++i) {
      const std::size_t at = std::size_t(t) * std::size_t(width) + std::size_t(i);
      if (std::size_t(i) >= want_ids.size()) {
        EXPECT_EQ(ids[at], -1);
        continue;
      }
      EXPECT_EQ(std::uint32_t(ids[at]), want_ids[std::size_t(i)]) << "rank " << i;
      if (std::isnan(want_weights[std::size_t(i)])) {
        EXPECT_TRUE(std::isnan(weights[at])) << "rank " << i;
      } else {
        EXPECT_EQ(std::memcmp(&weights[at], &want_weights[std::size_t(i)], sizeof(float)), 0)
            << "rank " << i << ": " << weights[at] << " against " << want_weights[std::size_t(i)];
      }
    }
  }
}

inline void PrintTo(const GpuRouterCase& c, std::ostream* os) { *os << c.name; }
inline std::string name_of(const ::testing::TestParamInfo<GpuRouterCase>& info) { return info.param.name; }

inline auto gpu_router_cases() {
  return ::testing::Values(GpuRouterCase{"mixtral", Family::mixtral, 8, 2, 0, 0},
                      GpuRouterCase{"mixtral_top_p_temperature", Family::mixtral, 8, 6, 0, 0, true, 0.7f},
                      GpuRouterCase{"qwen3_moe", Family::qwen3_moe, 128, 8, 0, 0},
                      GpuRouterCase{"qwen2_moe", Family::qwen2_moe, 60, 4, 0, 0},
                      GpuRouterCase{"olmoe", Family::olmoe, 64, 8, 0, 0},
                      GpuRouterCase{"gpt_oss", Family::gpt_oss, 32, 4, 0, 0},
                      GpuRouterCase{"deepseek_v3", Family::deepseek_v3, 256, 8, 8, 4},
                      GpuRouterCase{"deepseek_v3_top_p", Family::deepseek_v3, 256, 40, 8, 2, true},
                      GpuRouterCase{"deepseek_v3_small", Family::deepseek_v3, 16, 4, 4, 2},
                      GpuRouterCase{"beyond_the_old_limits", Family::qwen3_moe, 1024, 40, 0, 0},
                      GpuRouterCase{"one_expert", Family::mixtral, 1, 1, 0, 0});
}

}  // namespace moed::test
