#include "kernels/cpu/fixed_combine.h"

#include <cmath>

#include "kernels/cpu/fixed_order_gemm.h"

namespace moed::kernels {

namespace {
// The largest magnitude converted without overflow, leaving headroom for a few terms.
constexpr double kFixedLimit = 0x1p62;
}  // namespace

namespace detail {

// The scalar loop, the definition every width matches; `w` = weight * 2^32.
std::size_t add_weighted_fixed_scalar(std::int64_t* acc, const float* y, double w, std::size_t h) {
  std::size_t saturated = 0;
  for (std::size_t i = 0; i < h; ++i) {
    double t = w * double(y[i]);  // exact: 24-bit by 24-bit significands
    if (!(std::fabs(t) < kFixedLimit)) {  // also catches NaN
      if (!std::isfinite(t)) {
        acc[i] = kFixedNaN;
        continue;
      }
      ++saturated;
      t = std::copysign(kFixedLimit, t);
    }
    // llrint rounds half to even (the default mode); with -fno-math-errno it
    // is one cvtsd2si instead of a libm call.
    if (acc[i] != kFixedNaN)
      acc[i] = static_cast<std::int64_t>(static_cast<std::uint64_t>(acc[i]) +
                                         static_cast<std::uint64_t>(std::llrint(t)));
  }
  return saturated;
}

std::size_t add_weighted_fixed_avx512(std::int64_t* acc, const float* y, double w, std::size_t h, double limit);

}  // namespace detail

std::size_t add_weighted_fixed(std::int64_t* acc, const float* y, float weight, std::size_t h) {
  const double w = double(weight) * kFixedOne;  // exact: a power-of-two scale
#if MOED_X86_TILES
  // With the widest kernels, where the CPU converts doubles to int64 in vectors.
  if (gemm_isa() == GemmIsa::avx512 && cpu_has_avx512dq()) return detail::add_weighted_fixed_avx512(acc, y, w, h, kFixedLimit);
#endif
  return detail::add_weighted_fixed_scalar(acc, y, w, h);
}

void add_fixed(std::int64_t* acc, const std::int64_t* partial, std::size_t h) {
  for (std::size_t i = 0; i < h; ++i) {
    const std::int64_t sum = static_cast<std::int64_t>(static_cast<std::uint64_t>(acc[i]) +
                                                       static_cast<std::uint64_t>(partial[i]));
    acc[i] = acc[i] == kFixedNaN || partial[i] == kFixedNaN ? kFixedNaN : sum;
  }
}

void residual_from_fixed(const float* x, const std::int64_t* acc, std::size_t h, float* out) {
  for (std::size_t i = 0; i < h; ++i)
    out[i] = acc[i] == kFixedNaN ? std::numeric_limits<float>::quiet_NaN()
                                 : static_cast<float>(double(x[i]) + double(acc[i]) * (1.0 / kFixedOne));
}

}  // namespace moed::kernels
