#include "kernels/cpu/weight_codes.h"

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <limits>

namespace moed::kernels {

namespace {

// The positive values of a code table in code order (they increase), and
// the nearest one to `magnitude`, ties to the even code.
template <std::size_t N>
std::uint8_t nearest_code(const std::array<float, N>& values, float magnitude) {
  const auto above = std::lower_bound(values.begin(), values.end(), magnitude);
  if (above == values.begin()) return 0;
  if (above == values.end()) return std::uint8_t(N - 1);
  const auto hi = std::size_t(above - values.begin()), lo = hi - 1;
  const float up = values[hi] - magnitude, down = magnitude - values[lo];
  if (up < down) return std::uint8_t(hi);
  if (down < up) return std::uint8_t(lo);
  return std::uint8_t(hi % 2 == 0 ? hi : lo);
}

const std::array<float, 127>& fp8_positive() {
  static const std::array<float, 127> values = [] {
    std::array<float, 127> v{};
    for (std::size_t c = 0; c < v.size(); ++c) v[c] = fp8_value(std::uint8_t(c));
    return v;
  }();
  return values;
}

const std::array<float, 8>& fp4_positive() {
  static const std::array<float, 8> values = [] {
    std::array<float, 8> v{};
    for (std::size_t c = 0; c < v.size(); ++c) v[c] = fp4_value(std::uint8_t(c));
    return v;
  }();
  return values;
}

}  // namespace

const char* to_string(WeightDtype dtype) {
  switch (dtype) {
    case WeightDtype::f32:
      return "f32";
    case WeightDtype::bf16:
      return "bf16";
    case WeightDtype::fp8:
      return "fp8";
    case WeightDtype::mxfp4:
      return "mxfp4";
    case WeightDtype::int8:
      return "int8";
  }
  return "?";
}

bool parse_weight_dtype(const std::string& name, WeightDtype* out) {
  for (WeightDtype d : {WeightDtype::f32, WeightDtype::bf16, WeightDtype::fp8, WeightDtype::mxfp4, WeightDtype::int8})
    if (name == to_string(d)) {
      *out = d;
      return true;
    }
  return false;
}

float bf16_value(std::uint16_t code) { return std::bit_cast<float>(std::uint32_t(code) << 16); }

// The magnitude's 7 bits moved to an fp32's exponent and mantissa fields
// (bit 3 of the exponent field up to bit 26) make the value times 2^-120 for
// normal and subnormal codes alike; the multiply by 2^120 is exact. The
// vector decoders compute it the same way.
float fp8_value(std::uint8_t code) {
  if (fp8_is_nan(code)) return std::numeric_limits<float>::quiet_NaN();
  const float magnitude = std::bit_cast<float>(std::uint32_t(code & 0x7f) << 20) * 0x1p120f;
  return code & 0x80 ? -magnitude : magnitude;
}

std::uint8_t fp8_code(float value) {
  if (std::isnan(value)) return 0x7f;
  const std::uint8_t sign = std::signbit(value) ? 0x80 : 0;
  const float magnitude = std::fabs(value);
  if (magnitude >= kFp8Max) return sign | 0x7e;
  return sign | nearest_code(fp8_positive(), magnitude);
}

// Likewise: 3 bits moved to bits 22-24 give the value times 2^-126.
float fp4_value(std::uint8_t nibble) {
  const float magnitude = std::bit_cast<float>(std::uint32_t(nibble & 7) << 22) * 0x1p126f;
  return nibble & 8 ? -magnitude : magnitude;
}

std::uint8_t fp4_code(float value) {
  const std::uint8_t sign = std::signbit(value) ? 8 : 0;
  const float magnitude = std::fabs(value);
  if (std::isnan(value) || magnitude >= kFp4Max) return sign | 7;
  return sign | nearest_code(fp4_positive(), magnitude);
}

std::uint8_t mx_scale_code(float amax) {
  if (!(amax > 0)) return 127;
  if (!std::isfinite(amax)) return 254;
  int exponent = 0;
  std::frexp(amax, &exponent);  // amax = f 2^exponent, f in [0.5, 1): floor(log2 amax) = exponent - 1
  return std::uint8_t(std::clamp(exponent - 1 - 2 + 127, 0, 254));
}

}  // namespace moed::kernels
