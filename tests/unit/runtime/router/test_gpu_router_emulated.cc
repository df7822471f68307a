// The GPU router's kernel body (kernels/cuda/route_kernel.cuh), compiled for
// the host and run by 32 threads in lockstep, an emulated warp: its lane
// exchanges and barriers meet at a std::barrier. Held to runtime::route bit
// for bit on the cases the GPU test uses, so that the kernel's logic is
// checked where no GPU is. What this cannot check: CUDA's compilation of it
// (tests/unit/kernels_cuda/test_cuda_router.cc does, on a GPU).
#include <barrier>
#include <cstdint>
#include <cstring>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "tests/unit/runtime/router/gpu_router_cases.h"

namespace moed::cuda::route_detail {

// The emulated warp: one slot per lane for its exchanges, one barrier.
struct EmulatedWarp {
  std::barrier<> barrier{32};
  std::uint64_t slots[32] = {};
};
EmulatedWarp* emulated_warp = nullptr;
thread_local int emulated_lane = 0;

void warp_sync() { emulated_warp->barrier.arrive_and_wait(); }

// __shfl_xor_sync: every lane posts its value, then reads its partner's.
template <class T>
T warp_shfl_xor(T value, int lane_mask) {
  static_assert(sizeof(T) <= sizeof(std::uint64_t));
  std::uint64_t raw = 0;
  std::memcpy(&raw, &value, sizeof value);
  emulated_warp->slots[emulated_lane] = raw;
  warp_sync();
  raw = emulated_warp->slots[emulated_lane ^ lane_mask];
  warp_sync();
  T out;
  std::memcpy(&out, &raw, sizeof out);
  return out;
}

}  // namespace moed::cuda::route_detail

#include "kernels/cuda/route_kernel.cuh"

namespace moed::test {
namespace {

class GpuRouterEmulated : public ::testing::TestWithParam<GpuRouterCase> {};

TEST_P(GpuRouterEmulated, KernelBodyChoosesAsRuntimeRouteBitForBit) {
  namespace detail = cuda::route_detail;
  const GpuRouterCase& c = GetParam();
  const int tokens = 40;  // every adversarial row (0-10) and some random ones
  const GpuRouterLayer layer = layer_of(c, tokens);
  const kernels::RouteRule rule = layer.params.rule();
  const int width = kernels::route_width(rule, c.experts);
  std::vector<double> shared(detail::route_shared_bytes(c.experts, rule.groups, width) / sizeof(double) + 1);
  std::vector<int> ids(std::size_t(tokens) * width, -7), counts(std::size_t(tokens), -7);
  std::vector<float> weights(std::size_t(tokens) * width, -7.0f);
  // Poison the shared memory: the kernel must write all it reads.
  std::fill(shared.begin(), shared.end(), std::numeric_limits<double>::quiet_NaN());

  detail::EmulatedWarp warp;
  detail::emulated_warp = &warp;
  std::vector<std::thread> lanes;
  for (int lane = 0; lane < 32; ++lane) {
    lanes.emplace_back([&, lane] {
      detail::emulated_lane = lane;
      for (long long t = 0; t < tokens; ++t) {
        detail::route_token(lane, t, shared.data(), layer.logits.data(), c.experts, rule,
                            layer.bias.empty() ? nullptr : layer.bias.data(), width, ids.data(), weights.data(),
                            counts.data());
        detail::warp_sync();  // the next token's block reuses the shared memory
      }
    });
  }
  for (auto& lane : lanes) lane.join();
  detail::emulated_warp = nullptr;
  expect_same_routing(layer.expected, tokens, width, ids, weights, counts);
}

INSTANTIATE_TEST_SUITE_P(Families, GpuRouterEmulated, gpu_router_cases(), name_of);

}  // namespace
}  // namespace moed::test
