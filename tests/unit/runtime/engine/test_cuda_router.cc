// The route stage on a GPU (runtime/engine/cuda_router.h), plain and with
// the balancing bias's adjustments, against the CPU's, bit for bit: the
// normalised rows, and the experts and weights of every token (or, for a
// policy that chooses on the host, the logits), for Mixtral
// (and top-p), Qwen3-MoE, gpt-oss (its router bias) and DeepSeek-V3
// (sigmoid, selection bias, groups), on rows of every kind. Built where the
// CUDA kernels are; every test skips without a usable GPU.
#if defined(MOED_HAVE_CUDA_EXECUTOR)
#include "runtime/engine/cuda_router.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "common/rng.h"
#include "kernels/cpu/fixed_order_gemm.h"
#include "kernels/cpu/rms_norm.h"
#include "kernels/cuda/gpu_probe.h"
#include "placement/placement.h"
#include "runtime/config/config.h"
#include "runtime/weights/expert_store.h"

namespace moed::runtime {
namespace {

constexpr int kHidden = 64, kExperts = 16, kRows = 29;

struct Case {
  const char* name;
  std::vector<std::string> settings;
};

// The CPU route stage's RMSNorm and gate (with the router bias) of the rows of x.
void norm_and_gate_on_cpu(const Config& c, const ExpertStore& store, int layer, const std::vector<float>& x,
                          std::vector<float>& xn, std::vector<float>& logits) {
  const LayerWeights& w = store.layer(layer);
  const std::size_t rows = x.size() / kHidden;
  xn.resize(x.size());
  logits.resize(rows * kExperts);
  kernels::rms_norm(x.data(), w.norm.data(), rows, kHidden, float(c.model.norm_eps), xn.data());
  kernels::gemm_fixed_order(xn.data(), rows, kernels::PackedWeights(w.gate.data(), kExperts, kHidden), logits.data());
  if (!w.gate_bias.empty())
    for (std::size_t t = 0; t < rows; ++t)
      for (std::size_t e = 0; e < kExperts; ++e) logits[t * kExperts + e] += w.gate_bias[e];
}

// The CPU route stage's path (route_stage.cc) on `rows` rows of x: the plain
// router, or with the balancing bias's adjustments (rank_experts, then choose).
void route_on_cpu(const Config& c, const ExpertStore& store, int layer, const std::vector<float>& x,
                  std::vector<float>& xn, Routing& routing, const double* adjust = nullptr) {
  const LayerWeights& w = store.layer(layer);
  const std::size_t rows = x.size() / kHidden;
  std::vector<float> logits;
  norm_and_gate_on_cpu(c, store, layer, x, xn, logits);
  const RouterParams params = RouterParams::from(c).at_layer(w.selection_bias);
  Ranked ranked;
  rank_experts(logits.data(), adjust, rows, kExperts, params, 0, ranked);
  choose(ranked, params.spec, routing);
}

class CudaRouterMatchesCpu : public ::testing::TestWithParam<Case> {};

TEST_P(CudaRouterMatchesCpu, RowsAndRoutingBitForBit) {
  std::vector<std::string> settings = {"model.layers=2", "model.experts=16", "model.hidden=64", "model.ffn=128"};
  settings.insert(settings.end(), GetParam().settings.begin(), GetParam().settings.end());
  const Config c = load_config("", settings);
  const ExpertStore store = ExpertStore::load(c, placement::contiguous(1, 2, kExperts), 0);
  CounterRng rng(11);
  std::vector<float> x(std::size_t(kRows) * kHidden);
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = rng.normalish(i) * 2.0f;
  std::fill_n(x.begin() + 1 * kHidden, kHidden, 0.0f);
  std::fill_n(x.begin() + 2 * kHidden, kHidden, 1e30f);
  x[3 * kHidden + 5] = std::numeric_limits<float>::quiet_NaN();
  x[4 * kHidden + 9] = std::numeric_limits<float>::infinity();
  // The case itself, checked everywhere: the CPU routes every row.
  std::vector<float> want_xn;
  Routing want;
  route_on_cpu(c, store, 0, x, want_xn, want);
  ASSERT_EQ(want.tokens(), std::size_t(kRows));
  std::string why;
  if (!cuda::gpu_available(&why)) GTEST_SKIP() << why;
  CudaRouter gpu(c, store, 0);
  std::vector<double> adjust(std::size_t(kRows) * kExperts);  // a balancing bias's per-expert values
  for (std::size_t i = 0; i < adjust.size(); ++i) adjust[i] = double(int(i % kExperts * 5 % 11) - 5) / 32.0;
  for (int step = 0; step < 4; ++step) {
    const int layer = step % 2;
    const bool adjusted = step >= 2;
    SCOPED_TRACE("layer " + std::to_string(layer) + (adjusted ? ", adjusted" : ""));
    std::vector<float> got_xn(x.size());
    Routing got;
    want.clear();
    route_on_cpu(c, store, layer, x, want_xn, want, adjusted ? adjust.data() : nullptr);
    gpu.route(layer, x.data(), kRows, got_xn.data(), got, adjusted ? adjust.data() : nullptr);
    for (std::size_t i = 0; i < x.size(); ++i) {
      if (std::isnan(want_xn[i])) {
        EXPECT_TRUE(std::isnan(got_xn[i])) << "xn at " << i;
      } else {
        EXPECT_EQ(std::memcmp(&want_xn[i], &got_xn[i], sizeof(float)), 0) << "xn at " << i;
      }
    }
    ASSERT_EQ(got.tokens(), want.tokens());
    EXPECT_EQ(got.offsets, want.offsets);
    EXPECT_EQ(got.experts, want.experts);
    for (std::size_t i = 0; i < want.weights.size(); ++i) {
      if (std::isnan(want.weights[i])) {
        EXPECT_TRUE(std::isnan(got.weights[i])) << "weight " << i;
      } else {
        EXPECT_EQ(std::memcmp(&want.weights[i], &got.weights[i], sizeof(float)), 0) << "weight " << i;
      }
    }
  }
}

// Where a router policy chooses on the host, the device gives the
// normalised rows and the logits (the gate, and gpt-oss's router bias): the
// CPU's bits.
TEST_P(CudaRouterMatchesCpu, NormalisedRowsAndLogitsBitForBit) {
  std::vector<std::string> settings = {"model.layers=2", "model.experts=16", "model.hidden=64", "model.ffn=128"};
  settings.insert(settings.end(), GetParam().settings.begin(), GetParam().settings.end());
  const Config c = load_config("", settings);
  const ExpertStore store = ExpertStore::load(c, placement::contiguous(1, 2, kExperts), 0);
  CounterRng rng(13);
  std::vector<float> x(std::size_t(kRows) * kHidden);
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = rng.normalish(i) * 3.0f;
  std::fill_n(x.begin() + 2 * kHidden, kHidden, 1e30f);
  std::string why;
  if (!cuda::gpu_available(&why)) GTEST_SKIP() << why;
  CudaRouter gpu(c, store, 0);
  for (int layer = 0; layer < 2; ++layer) {
    SCOPED_TRACE("layer " + std::to_string(layer));
    std::vector<float> want_xn, want_logits;
    norm_and_gate_on_cpu(c, store, layer, x, want_xn, want_logits);
    std::vector<float> got_xn(x.size()), got_logits(want_logits.size());
    gpu.norm_and_gate(layer, x.data(), kRows, got_xn.data(), got_logits.data());
    EXPECT_EQ(std::memcmp(got_xn.data(), want_xn.data(), x.size() * sizeof(float)), 0);
    EXPECT_EQ(std::memcmp(got_logits.data(), want_logits.data(), want_logits.size() * sizeof(float)), 0);
  }
}

INSTANTIATE_TEST_SUITE_P(
    Families, CudaRouterMatchesCpu,
    ::testing::Values(Case{"mixtral", {"model.family=mixtral", "model.top_k=2"}},
                      Case{"mixtral_top_p", {"model.family=mixtral", "model.top_k=4", "router.mode=topp",
                                             "router.top_p=0.6", "router.min_k=1", "router.max_k=4"}},
                      Case{"qwen3_moe", {"model.family=qwen3_moe", "model.top_k=4"}},
                      Case{"gpt_oss", {"model.family=gpt_oss", "model.top_k=4"}},
                      Case{"deepseek_v3", {"model.family=deepseek_v3", "model.top_k=4", "model.groups=4",
                                           "model.groups_kept=2"}}),
    [](const ::testing::TestParamInfo<Case>& info) { return std::string(info.param.name); });

}  // namespace
}  // namespace moed::runtime
#endif  // MOED_HAVE_CUDA_EXECUTOR
