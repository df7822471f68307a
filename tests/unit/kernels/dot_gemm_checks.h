// What the dot-product GEMMs' tests share (test_bf16_dot.cc, test_amx.cc):
// the exact value of an encoded weight's code, as their definitions read
// it, and the checks that every kernel is a definition and that the error
// stays within the activations' bf16 rounding.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <limits>
#include <vector>

#include "kernels/cpu/encoded_matrix.h"
#include "kernels/cpu/fixed_order_gemm.h"
#include "kernels/cpu/quant_weights.h"
#include "kernels/cpu/weight_codes.h"
#include "tests/unit/kernels/isas_here.h"
#include "tests/unit/test_support.h"

namespace moed::test {

using kernels::EncodedMatrix;
using kernels::WeightDtype;

// The code value of weight (i, j), its scale not applied.
inline float code_value(const EncodedMatrix& e, std::size_t i, std::size_t j) {
  const std::size_t at = i * e.k + j;
  switch (e.dtype) {
    case WeightDtype::bf16: {
      std::uint16_t code;
      std::memcpy(&code, e.codes.data() + 2 * at, 2);
      return kernels::bf16_value(code);
    }
    case WeightDtype::fp8:
      return kernels::fp8_value(e.codes[at]);
    case WeightDtype::int8:
      return float(std::int8_t(e.codes[at]));
    case WeightDtype::mxfp4:
      return kernels::fp4_value(std::uint8_t(e.codes[at / 2] >> (4 * (at % 2)) & 15));
    case WeightDtype::f32:
      break;
  }
  return std::numeric_limits<float>::quiet_NaN();
}

inline float flushed(float x) { return std::fpclassify(x) == FP_SUBNORMAL ? std::copysign(0.0f, x) : x; }

// A GEMM's definition, one output at a time: columns [k0, k1) of x (the
// whole row) against W's row j.
using Definition = float (*)(const EncodedMatrix& e, const float* x, std::size_t j, std::size_t k0, std::size_t k1);

// With the products set: `e` gives the definition at each row count of
// `rows`, on every instruction set here; the rows uniform in [-1, 1) times
// 2^row_exponent.
inline void expect_definition_at_rows(Definition definition, const kernels::EncodedMatrix& e,
                                      std::initializer_list<std::size_t> rows, int row_exponent = 0) {
  using namespace kernels;
  const QuantWeights quant(e);
  for (std::size_t m : rows) {
    std::vector<float> a = random_floats(m * e.k, 10);
    for (float& x : a) x = std::ldexp(x, row_exponent);
    std::vector<float> want(m * e.n), got(m * e.n);
    for (std::size_t i = 0; i < m; ++i)
      for (std::size_t j = 0; j < e.n; ++j) want[i * e.n + j] = definition(e, a.data() + i * e.k, j, 0, e.k);
    for (GemmIsa isa : isas_here()) {
      set_gemm_isa(isa);
      gemm_fixed_order(a.data(), m, quant, got.data());
      EXPECT_EQ(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)), 0) << m << " rows " << to_string(isa);
    }
  }
  set_gemm_isa(best_gemm_isa());
}

// With the products set: an mxfp4 matrix whose 512 scale blocks carry
// every e8m0 code (0: 2^-127, 255: NaN) gives the definition at each row
// count of `rows` (the fused and the buffered tiles), on every instruction
// set here.
inline void expect_every_mx_scale_code_applies(Definition definition, std::initializer_list<std::size_t> rows) {
  using namespace kernels;
  const std::size_t n = 64, k = 256;
  EncodedMatrix e = encode(WeightDtype::mxfp4, random_floats(n * k, 9).data(), n, k);
  for (std::size_t b = 0; b < e.scales.size(); ++b) e.scales[b] = std::uint8_t(b * 5);
  expect_definition_at_rows(definition, e, rows);
}

// With the products set: every instruction set here gives the definition
// for every row (a subnormal activation among them); a k range from a scale
// block's start equals the matrix of those columns and the definition on it.
inline void expect_every_kernel_is(Definition definition, WeightDtype dtype, std::size_t m, std::size_t n,
                                   std::size_t k) {
  using namespace kernels;
  const EncodedMatrix encoded = encode(dtype, random_floats(n * k, 31).data(), n, k);
  const QuantWeights quant(encoded);
  std::vector<float> a = random_floats(m * k, 32);
  a[0] = 1e-39f;  // a subnormal activation: read as 0, as the instructions read it
  std::vector<float> want(m * n);
  for (std::size_t i = 0; i < m; ++i)
    for (std::size_t j = 0; j < n; ++j) want[i * n + j] = definition(encoded, a.data() + i * k, j, 0, k);
  const std::size_t grain = column_grain(dtype), k0 = k / 3 / grain * grain, k1 = (k - k / 5) / grain * grain;
  const QuantWeights columns(columns_of(encoded, k0, k1));
  for (GemmIsa isa : isas_here()) {
    set_gemm_isa(isa);
    std::vector<float> got(m * n, -1.0f);
    gemm_fixed_order(a.data(), m, quant, got.data());
    EXPECT_EQ(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)), 0) << to_string(isa);
    std::vector<float> range(m * n), alone(m * n);
    gemm_fixed_order_range(a.data() + k0, m, quant, k0, k1, range.data(), k);
    gemm_fixed_order(a.data() + k0, m, columns, alone.data(), k);
    EXPECT_EQ(std::memcmp(range.data(), alone.data(), range.size() * sizeof(float)), 0) << to_string(isa) << " range";
    for (std::size_t i = 0; i < m; i += 5)
      EXPECT_EQ(range[i * n], definition(encoded, a.data() + i * k, 0, k0, k1)) << to_string(isa) << " row " << i;
  }
}

// With the products set: only the activations' rounding separates the
// result from fp32 on the same values: each term's relative error is at most
// 2^-8 (one bf16 rounding) plus fp32's.
inline void expect_error_within_bf16_rounding(WeightDtype dtype, std::size_t m, std::size_t n, std::size_t k) {
  const EncodedMatrix encoded = kernels::encode(dtype, random_floats(n * k, 41).data(), n, k);
  const std::vector<float> values = encoded.values(), a = random_floats(m * k, 42);
  std::vector<float> got(m * n);
  kernels::gemm_fixed_order(a.data(), m, kernels::QuantWeights(encoded), got.data());
  for (std::size_t i = 0; i < m; ++i)
    for (std::size_t j = 0; j < n; ++j) {
      double exact = 0, magnitude = 0;
      for (std::size_t kk = 0; kk < k; ++kk) {
        exact += double(a[i * k + kk]) * values[j * k + kk];
        magnitude += std::fabs(double(a[i * k + kk]) * values[j * k + kk]);
      }
      ASSERT_LE(std::fabs(got[i * n + j] - exact), magnitude * (std::ldexp(1.0, -8) + k * std::ldexp(1.0, -23)))
          << "row " << i << " column " << j;
    }
}

}  // namespace moed::test
