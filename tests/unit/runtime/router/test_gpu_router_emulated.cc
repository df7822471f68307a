// The GPU route stage's warp bodies (kernels/cuda/route_kernel.cuh: the
// RMSNorm and the router), compiled for the host and run by 32 threads in
// lockstep, an emulated warp: its lane exchanges and barriers meet at a
// std::barrier. Held to kernels::rms_norm and runtime::route bit for bit (the
// router on the cases the GPU test uses, also with the router policies'
// adjustments against rank_experts and choose), so that the kernels' logic is
// checked where no GPU is. What this cannot check: CUDA's compilation of
// them (tests/unit/kernels_cuda does, on a GPU).
#include <barrier>
#include <bit>
#include <cstdint>
#include <cstring>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "kernels/cpu/rms_norm.h"
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

// __shfl_sync: every lane posts its value, then reads lane `from_lane`'s.
template <class T>
T warp_shfl(T value, int from_lane) {
  static_assert(sizeof(T) <= sizeof(std::uint64_t));
  std::uint64_t raw = 0;
  std::memcpy(&raw, &value, sizeof value);
  emulated_warp->slots[emulated_lane] = raw;
  warp_sync();
  raw = emulated_warp->slots[from_lane];
  warp_sync();
  T out;
  std::memcpy(&out, &raw, sizeof out);
  return out;
}

// __shfl_xor_sync: the partner's value.
template <class T>
T warp_shfl_xor(T value, int lane_mask) {
  return warp_shfl(value, emulated_lane ^ lane_mask);
}

// Runs body(lane) on 32 threads, a warp in lockstep at its exchanges.
template <class Body>
void run_warp(Body&& body) {
  EmulatedWarp warp;
  emulated_warp = &warp;
  std::vector<std::thread> lanes;
  for (int lane = 0; lane < 32; ++lane) {
    lanes.emplace_back([&body, lane] {
      emulated_lane = lane;
      body(lane);
    });
  }
  for (auto& lane : lanes) lane.join();
  emulated_warp = nullptr;
}

}  // namespace moed::cuda::route_detail

#include "kernels/cuda/route_kernel.cuh"

namespace moed::test {
namespace {

class GpuRouterEmulated : public ::testing::TestWithParam<GpuRouterCase> {};

// The kernel body over every token of a case's layer, with or without the adjustments.
void expect_kernel_body_chooses_as_the_cpu(const GpuRouterCase& c, bool adjusted) {
  namespace detail = cuda::route_detail;
  const int tokens = 40;  // every adversarial row (0-10) and some random ones
  const GpuRouterLayer layer = layer_of(c, tokens);
  const kernels::RouteRule rule = layer.params.rule();
  const int width = kernels::route_width(rule, c.experts);
  const std::size_t shared_bytes = detail::route_shared_bytes(c.experts, rule.groups, width);
  std::vector<double> shared(shared_bytes / sizeof(double) + 1);
  std::vector<int> ids(std::size_t(tokens) * width, -7), counts(std::size_t(tokens), -7);
  std::vector<float> weights(std::size_t(tokens) * width, -7.0f);

  detail::run_warp([&](int lane) {
    for (long long t = 0; t < tokens; ++t) {
      // Poison the shared memory before each token, as a new block finds it:
      // the kernel must write all it reads (0xa5 is no state and no small id).
      if (lane == 0) std::memset(shared.data(), 0xa5, shared_bytes);
      detail::warp_sync();
      detail::route_token(lane, t, shared.data(), layer.logits.data(), c.experts, rule,
                          layer.bias.empty() ? nullptr : layer.bias.data(),
                          adjusted ? layer.adjust.data() : nullptr, width, ids.data(), weights.data(), counts.data());
      detail::warp_sync();  // the next token's block reuses the shared memory
    }
  });
  expect_same_routing(adjusted ? layer.adjusted : layer.expected, tokens, width, ids, weights, counts);
}

TEST_P(GpuRouterEmulated, KernelBodyChoosesAsRuntimeRouteBitForBit) {
  expect_kernel_body_chooses_as_the_cpu(GetParam(), false);
}

// With the router policies' adjustments: as rank_experts (then choose) with them.
TEST_P(GpuRouterEmulated, KernelBodyWithAdjustmentsChoosesAsRankExpertsBitForBit) {
  expect_kernel_body_chooses_as_the_cpu(GetParam(), true);
}

INSTANTIATE_TEST_SUITE_P(Families, GpuRouterEmulated, gpu_router_cases(), name_of);

// The RMSNorm's warp body against kernels::rms_norm, on rows of every kind
// and widths around the 32-column steps, at eps 1e-5 and 0 (the CPU's
// infinite-inverse branch), out of place and in place.
TEST(GpuRmsNormEmulated, RowBodyHasTheCpuBits) {
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  for (int hidden : {1, 33, 70}) {
    std::mt19937 rng{unsigned(hidden)};
    std::uniform_real_distribution<float> value(-3.0f, 3.0f), scale(0.5f, 1.5f);
    const int rows = 7;
    std::vector<float> x(std::size_t(rows) * hidden), weight(static_cast<std::size_t>(hidden));
    for (float& v : x) v = value(rng);
    for (float& w : weight) w = scale(rng);
    auto row = [&](int r) { return x.begin() + std::ptrdiff_t(r) * hidden; };
    std::fill_n(row(1), hidden, 0.0f);
    std::fill_n(row(2), hidden, 1e30f);
    std::fill_n(row(3), hidden, 1e-40f);  // rms below 1 / FLT_MAX: eps 0 takes the double branch
    std::fill_n(row(4), hidden, 3e38f);
    x[std::size_t(5) * hidden] = nan;
    x[std::size_t(6) * hidden + std::size_t(hidden) / 2] = inf;
    for (float eps : {1e-5f, 0.0f}) {
      SCOPED_TRACE("hidden " + std::to_string(hidden) + ", eps " + std::to_string(eps));
      std::vector<float> want(x.size()), got(x.size()), in_place = x;
      kernels::rms_norm(x.data(), weight.data(), std::size_t(rows), std::size_t(hidden), eps, want.data());
      cuda::route_detail::run_warp([&](int lane) {
        for (int r = 0; r < rows; ++r) {
          const std::size_t at = std::size_t(r) * std::size_t(hidden);
          cuda::route_detail::rms_norm_row(lane, x.data() + at, weight.data(), hidden, eps, got.data() + at);
          cuda::route_detail::rms_norm_row(lane, in_place.data() + at, weight.data(), hidden, eps,
                                           in_place.data() + at);
        }
      });
      for (std::size_t i = 0; i < want.size(); ++i) {
        if (std::isnan(want[i])) {
          EXPECT_TRUE(std::isnan(got[i]) && std::isnan(in_place[i])) << "at " << i;
        } else {
          EXPECT_EQ(std::bit_cast<std::uint32_t>(got[i]), std::bit_cast<std::uint32_t>(want[i])) << "at " << i;
          EXPECT_EQ(std::bit_cast<std::uint32_t>(in_place[i]), std::bit_cast<std::uint32_t>(want[i])) << "at " << i;
        }
      }
    }
  }
}

}  // namespace
}  // namespace moed::test
