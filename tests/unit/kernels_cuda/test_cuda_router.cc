// The GPU's router (route_tokens) against the CPU's, runtime::route itself,
// linked (gpu_router_cases.h): bit for bit, ids, weights and counts; with
// the router policies' adjustments, against rank_experts and choose. The GPU
// test skips where no usable device is found; the refusals run everywhere.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "kernels/cpu/router_body.h"
#include "kernels/cuda/cuda_kernels.h"
#include "tests/unit/runtime/router/gpu_router_cases.h"

namespace moed::test {
namespace {

using cuda::DeviceBuffer;
using cuda::Stream;

class GpuRouter : public ::testing::TestWithParam<GpuRouterCase> {};

void expect_gpu_chooses_as_the_cpu(const GpuRouterCase& c, bool adjusted) {
  const int tokens = 203;
  const GpuRouterLayer layer = layer_of(c, tokens);
  const kernels::RouteRule rule = layer.params.rule();
  const int width = kernels::route_width(rule, c.experts);
  std::string why;
  if (!cuda::gpu_available(&why)) GTEST_SKIP() << why;
  Stream stream;
  DeviceBuffer<float> d_logits(layer.logits.size()), d_bias(layer.bias.size());
  DeviceBuffer<float> d_weights(std::size_t(tokens) * width);
  DeviceBuffer<int> d_ids(std::size_t(tokens) * width), d_counts{std::size_t(tokens)};
  DeviceBuffer<double> d_adjust(layer.adjust.size());
  d_logits.upload(layer.logits);
  d_adjust.upload(layer.adjust);
  if (!layer.bias.empty()) d_bias.upload(layer.bias);
  cuda::route_tokens(d_logits.data(), tokens, c.experts, rule, layer.bias.empty() ? nullptr : d_bias.data(),
                     adjusted ? d_adjust.data() : nullptr, d_ids.data(), d_weights.data(), d_counts.data(), stream);
  stream.synchronize();
  expect_same_routing(adjusted ? layer.adjusted : layer.expected, tokens, width, d_ids.download(),
                      d_weights.download(), d_counts.download());
}

TEST_P(GpuRouter, ChoosesAsRuntimeRouteBitForBit) { expect_gpu_chooses_as_the_cpu(GetParam(), false); }

// The router policies' adjustments: as rank_experts (then choose) with them.
TEST_P(GpuRouter, WithAdjustmentsChoosesAsRankExpertsBitForBit) { expect_gpu_chooses_as_the_cpu(GetParam(), true); }

INSTANTIATE_TEST_SUITE_P(Families, GpuRouter, gpu_router_cases(), name_of);

// The refusals, before any launch: they need no GPU.
TEST(GpuRouterRefuses, RulesTheCpuRouterRefuses) {
  kernels::RouteRule rule;
  rule.top_k = 9;
  auto refused = [&](int experts) {
    try {
      cuda::route_tokens(nullptr, 1, experts, rule, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr);
    } catch (const std::invalid_argument& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_NE(refused(8).find("k must be at least 1"), std::string::npos) << refused(8);
  rule.top_k = 2;
  rule.groups = 3;
  EXPECT_NE(refused(8).find("groups must divide"), std::string::npos) << refused(8);
  rule.groups = 4;
  rule.groups_kept = 1;
  rule.top_k = 3;  // 2 experts in the one kept group
  EXPECT_NE(refused(8).find("kept groups"), std::string::npos) << refused(8);
  rule.top_k = 2;
  rule.temperature = 0;
  EXPECT_NE(refused(8).find("temperature"), std::string::npos) << refused(8);
}

}  // namespace
}  // namespace moed::test
