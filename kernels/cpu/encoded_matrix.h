// A weight matrix [n, k] (torch Linear layout: one output per row) in one
// of the formats of weight_codes.h, row-major, as checkpoints ship it and as
// a migrated slot travels: the codes, then the scales.
//
//   f32, bf16, int8, fp8: one code per weight (4, 2, 1, 1 bytes);
//   mxfp4: two per byte, weight 2i in the low nibble, k a multiple of 32;
//   scales: fp8 an fp32 per 128 x 128 tile ([ceil(n/128), ceil(k/128)]),
//           int8 an fp32 per row [n], mxfp4 an e8m0 byte per 32 weights of a
//           row [n, k/32]; f32 and bf16 none.
//
// A weight's value is value(i, j) (one exact conversion and at most one
// fp32 multiply), which every kernel computes with bit for bit.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "kernels/cpu/weight_codes.h"

namespace moed::kernels {

struct EncodedMatrix {
  WeightDtype dtype = WeightDtype::f32;
  std::size_t n = 0, k = 0;
  std::vector<std::uint8_t> codes;
  std::vector<std::uint8_t> scales;  // fp32s (fp8, int8) or e8m0 bytes (mxfp4)

  // Bytes of the codes and of the scales a matrix of this shape takes.
  static std::size_t code_bytes(WeightDtype dtype, std::size_t n, std::size_t k);
  static std::size_t scale_bytes(WeightDtype dtype, std::size_t n, std::size_t k);
  std::size_t bytes() const { return codes.size() + scales.size(); }

  float value(std::size_t i, std::size_t j) const;
  // Every weight's value, [n, k] row-major.
  std::vector<float> values() const;
  float scale(std::size_t i, std::size_t j) const;  // the scale weight (i, j) is multiplied by (1: none)
  // Empty when every code and scale is a number; else where the first
  // NaN is ("row 3 column 7: an fp8 NaN code", "row 2 block 1: e8m0 255").
  std::string find_nan() const;

  // Codes then scales, bytes() of them; from_bytes reads them back.
  void to_bytes(std::uint8_t* out) const;
  static EncodedMatrix from_bytes(WeightDtype dtype, std::size_t n, std::size_t k, const std::uint8_t* in);
};

// The largest grid a format's scales fall on: a shard's rows or columns
// must start and end on it (fp8: 128 rows and columns; mxfp4: 32 columns).
std::size_t row_grain(WeightDtype dtype);
std::size_t column_grain(WeightDtype dtype);

// w [n, k] in `dtype`: bf16 rounds to nearest even; fp8 scales each tile by
// its max |w| / 448 (DeepSeek's recipe), mxfp4 each 32 of a row by
// mx_scale_code, int8 each row by its max |w| / 127 (all-zero: scale 1).
EncodedMatrix encode(WeightDtype dtype, const float* w, std::size_t n, std::size_t k);

// Rows [r0, r1), columns [c0, c1), and a above b; the cuts must fall on the
// format's grain (an Internal error otherwise: callers check the shapes).
EncodedMatrix rows_of(const EncodedMatrix& m, std::size_t r0, std::size_t r1);
EncodedMatrix columns_of(const EncodedMatrix& m, std::size_t c0, std::size_t c1);
EncodedMatrix stack(const EncodedMatrix& a, const EncodedMatrix& b);

}  // namespace moed::kernels
