#include "kernels/cpu/fixed_combine.h"

#include <bit>
#include <cmath>
#include <cstring>

#include "common/error.h"
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

namespace {

// a + b, wrapping (exact when the whole sum ends in range); kFixedNaN on either side stays.
std::int64_t fixed_sum(std::int64_t a, std::int64_t b) {
  const auto sum = static_cast<std::int64_t>(static_cast<std::uint64_t>(a) + static_cast<std::uint64_t>(b));
  return a == kFixedNaN || b == kFixedNaN ? kFixedNaN : sum;
}

}  // namespace

void add_fixed(std::int64_t* acc, const std::int64_t* partial, std::size_t h) {
  for (std::size_t i = 0; i < h; ++i) acc[i] = fixed_sum(acc[i], partial[i]);
}

int fixed_width_bytes(const std::int64_t* v, std::size_t h) {
  // Bits a value needs beyond its sign: those of v for v >= 0, of ~v below.
  std::uint64_t magnitude = 0;
  for (std::size_t i = 0; i < h; ++i) magnitude |= static_cast<std::uint64_t>(v[i] ^ (v[i] >> 63));
  const int bits = 64 - std::countl_zero(magnitude) + 1;  // and the sign
  return (bits + 7) / 8;
}

namespace {

static_assert(std::endian::native == std::endian::little, "narrow rows are the low bytes of each value");

// One width at compile time, so that each element is a fixed-size copy.
template <int W>
void narrow_fixed_w(const std::byte* in, std::size_t h, std::byte* out) {
  for (std::size_t i = 0; i < h; ++i) {
    std::int64_t v;
    std::memcpy(&v, in + i * 8, 8);  // read before the write, which may reach into it
    std::memcpy(out + i * W, &v, W);
  }
}

template <int W>
void add_narrow_fixed_w(std::int64_t* acc, const std::byte* in, std::size_t h) {
  for (std::size_t i = 0; i < h; ++i) {
    std::uint64_t u = 0;
    std::memcpy(&u, in + i * W, W);
    acc[i] = fixed_sum(acc[i], static_cast<std::int64_t>(u << (64 - 8 * W)) >> (64 - 8 * W));  // sign-extended
  }
}

// op.template operator()<W>() for the run-time width W.
template <class Op>
void by_width(int width, Op&& op) {
  switch (width) {
    case 1: return op.template operator()<1>();
    case 2: return op.template operator()<2>();
    case 3: return op.template operator()<3>();
    case 4: return op.template operator()<4>();
    case 5: return op.template operator()<5>();
    case 6: return op.template operator()<6>();
    case 7: return op.template operator()<7>();
    case 8: return op.template operator()<8>();
  }
  MOED_THROW(Internal, "a narrow fixed-point row of {} bytes per element (1 to 8 are valid)", width);
}

}  // namespace

void narrow_fixed(const std::byte* in, std::size_t h, int width, std::byte* out) {
  if (width == 8 && in == out) return;
  by_width(width, [&]<int W>() { narrow_fixed_w<W>(in, h, out); });
}

void add_narrow_fixed(std::int64_t* acc, const std::byte* in, int width, std::size_t h) {
  by_width(width, [&]<int W>() { add_narrow_fixed_w<W>(acc, in, h); });
}

void residual_from_fixed(const float* x, const std::int64_t* acc, std::size_t h, float* out) {
  for (std::size_t i = 0; i < h; ++i)
    out[i] = acc[i] == kFixedNaN ? std::numeric_limits<float>::quiet_NaN()
                                 : static_cast<float>(double(x[i]) + double(acc[i]) * (1.0 / kFixedOne));
}

}  // namespace moed::kernels
