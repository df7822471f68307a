// The synthetic tokens' noise: every instruction set's loop gives the bits
// of the scalar CounterRng loop it replaces (so synthetic tokens, and every
// output derived from them, are the same on every host).
#include "kernels/cpu/normalish.h"

#include <gtest/gtest.h>

#include <bit>
#include <cstdint>
#include <vector>

#include "common/rng.h"
#include "kernels/cpu/fixed_order_gemm.h"

namespace moed::kernels {
namespace {

class AddNormalish : public ::testing::TestWithParam<GemmIsa> {};

TEST_P(AddNormalish, GivesTheScalarLoopsBits) {
  const GemmIsa isa = GetParam();
  if (best_gemm_isa() < isa) GTEST_SKIP() << "this CPU cannot run " << to_string(isa);
  const GemmIsa before = gemm_isa();
  set_gemm_isa(isa);
  for (std::uint64_t key : {0ull, 1ull, 0x5bd1e995ull, ~0ull}) {
    for (float factor : {0.5f, -0.35f, 1.0f}) {
      for (std::size_t n : {std::size_t(1), std::size_t(7), std::size_t(16), std::size_t(33), std::size_t(1024)}) {
        std::vector<float> want(n), got(n);
        for (std::size_t i = 0; i < n; ++i) want[i] = got[i] = float(i % 5) - 2.25f;
        const CounterRng noise(key);
        for (std::size_t i = 0; i < n; ++i) want[i] += factor * noise.normalish(i);
        add_normalish(key, factor, got.data(), n);
        for (std::size_t i = 0; i < n; ++i)
          ASSERT_EQ(std::bit_cast<std::uint32_t>(got[i]), std::bit_cast<std::uint32_t>(want[i]))
              << to_string(isa) << " key " << key << " n " << n << " i " << i;
      }
    }
  }
  set_gemm_isa(before);
}

TEST_P(AddNormalish, ScaledDirectionsGiveTheScalarLoopsBits) {
  const GemmIsa isa = GetParam();
  if (best_gemm_isa() < isa) GTEST_SKIP() << "this CPU cannot run " << to_string(isa);
  const GemmIsa before = gemm_isa();
  set_gemm_isa(isa);
  const CounterRng g(7);
  for (std::size_t n : {std::size_t(1), std::size_t(15), std::size_t(16), std::size_t(1027)}) {
    std::vector<float> d(n), want(n), got(n);
    for (std::size_t i = 0; i < n; ++i) d[i] = g.normalish(2 * i), want[i] = got[i] = g.symmetric(2 * i + 1);
    const float scale = 0.7f, c = 0.93f, signal = 32.0f;
    for (std::size_t i = 0; i < n; ++i) want[i] += scale * c * signal * d[i];
    add_scaled(scale * c * signal, d.data(), got.data(), n);
    for (std::size_t i = 0; i < n; ++i)
      ASSERT_EQ(std::bit_cast<std::uint32_t>(got[i]), std::bit_cast<std::uint32_t>(want[i])) << to_string(isa) << " n " << n;
  }
  set_gemm_isa(before);
}

INSTANTIATE_TEST_SUITE_P(EveryInstructionSet, AddNormalish,
                         ::testing::Values(GemmIsa::portable, GemmIsa::avx2, GemmIsa::avx512),
                         [](const auto& info) { return to_string(info.param); });

}  // namespace
}  // namespace moed::kernels
