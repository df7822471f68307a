#include "kernels/cpu/encoded_matrix.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "common/error.h"

namespace moed::kernels {

namespace {

std::size_t ceil_div(std::size_t a, std::size_t b) { return (a + b - 1) / b; }
constexpr std::size_t kTile = std::size_t(kFp8Tile), kBlock = std::size_t(kMxBlock);

// Bytes one row's codes take.
std::size_t row_code_bytes(WeightDtype dtype, std::size_t k) {
  switch (dtype) {
    case WeightDtype::f32:
      return 4 * k;
    case WeightDtype::bf16:
      return 2 * k;
    case WeightDtype::fp8:
    case WeightDtype::int8:
      return k;
    case WeightDtype::mxfp4:
      return k / 2;
  }
  return 0;
}

float load_f32(const std::uint8_t* p) {
  float v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
void store_f32(std::uint8_t* p, float v) { std::memcpy(p, &v, sizeof v); }

// Scale rows (as laid out) [a, b) of a [rows, width] grid of `bytes`-wide entries.
std::vector<std::uint8_t> grid_rows(const std::vector<std::uint8_t>& grid, std::size_t width_bytes, std::size_t a,
                                    std::size_t b) {
  return {grid.begin() + std::ptrdiff_t(a * width_bytes), grid.begin() + std::ptrdiff_t(b * width_bytes)};
}
// Columns [a, b) (in entries of `entry` bytes) of every row of a grid `width` entries wide.
std::vector<std::uint8_t> grid_columns(const std::vector<std::uint8_t>& grid, std::size_t width, std::size_t entry,
                                       std::size_t a, std::size_t b) {
  std::vector<std::uint8_t> out;
  const std::size_t rows = width ? grid.size() / (width * entry) : 0;
  out.reserve(rows * (b - a) * entry);
  for (std::size_t r = 0; r < rows; ++r) {
    const auto* row = grid.data() + r * width * entry;
    out.insert(out.end(), row + a * entry, row + b * entry);
  }
  return out;
}

}  // namespace

std::size_t EncodedMatrix::code_bytes(WeightDtype dtype, std::size_t n, std::size_t k) {
  return n * row_code_bytes(dtype, k);
}

std::size_t EncodedMatrix::scale_bytes(WeightDtype dtype, std::size_t n, std::size_t k) {
  switch (dtype) {
    case WeightDtype::fp8:
      return 4 * ceil_div(n, kTile) * ceil_div(k, kTile);
    case WeightDtype::int8:
      return 4 * n;
    case WeightDtype::mxfp4:
      return n * (k / kBlock);
    case WeightDtype::f32:
    case WeightDtype::bf16:
      return 0;
  }
  return 0;
}

std::size_t row_grain(WeightDtype dtype) { return dtype == WeightDtype::fp8 ? kTile : 1; }
std::size_t column_grain(WeightDtype dtype) {
  return dtype == WeightDtype::fp8 ? kTile : dtype == WeightDtype::mxfp4 ? kBlock : 1;
}

float EncodedMatrix::scale(std::size_t i, std::size_t j) const {
  switch (dtype) {
    case WeightDtype::fp8:
      return load_f32(scales.data() + 4 * ((i / kTile) * ceil_div(k, kTile) + j / kTile));
    case WeightDtype::int8:
      return load_f32(scales.data() + 4 * i);
    case WeightDtype::mxfp4:
      return e8m0_value(scales[i * (k / kBlock) + j / kBlock]);
    case WeightDtype::f32:
    case WeightDtype::bf16:
      return 1.0f;
  }
  return 1.0f;
}

float EncodedMatrix::value(std::size_t i, std::size_t j) const {
  const std::uint8_t* row = codes.data() + i * row_code_bytes(dtype, k);
  switch (dtype) {
    case WeightDtype::f32:
      return load_f32(row + 4 * j);
    case WeightDtype::bf16: {
      std::uint16_t code;
      std::memcpy(&code, row + 2 * j, 2);
      return bf16_value(code);
    }
    case WeightDtype::fp8:
      return fp8_value(row[j]) * scale(i, j);
    case WeightDtype::int8:
      return float(std::int8_t(row[j])) * scale(i, j);
    case WeightDtype::mxfp4:
      return fp4_value(std::uint8_t(row[j / 2] >> (4 * (j % 2)) & 15)) * scale(i, j);
  }
  return 0.0f;
}

std::vector<float> EncodedMatrix::values() const {
  std::vector<float> out(n * k);
  for (std::size_t i = 0; i < n; ++i)
    for (std::size_t j = 0; j < k; ++j) out[i * k + j] = value(i, j);
  return out;
}

std::string EncodedMatrix::find_nan() const {
  if (dtype == WeightDtype::fp8)
    for (std::size_t i = 0; i < codes.size(); ++i)
      if (fp8_is_nan(codes[i])) return fmt::format("row {} column {}: an fp8 NaN code", i / k, i % k);
  if (dtype == WeightDtype::mxfp4)
    for (std::size_t i = 0; i < scales.size(); ++i)
      if (scales[i] == 255) return fmt::format("row {} block {}: the e8m0 NaN scale (255)", i / (k / kBlock), i % (k / kBlock));
  if (dtype == WeightDtype::fp8 || dtype == WeightDtype::int8)
    for (std::size_t i = 0; i < scales.size(); i += 4)
      if (!std::isfinite(load_f32(scales.data() + i))) return fmt::format("scale {}: {}", i / 4, load_f32(scales.data() + i));
  return "";
}

void EncodedMatrix::to_bytes(std::uint8_t* out) const {
  std::copy(codes.begin(), codes.end(), out);
  std::copy(scales.begin(), scales.end(), out + codes.size());
}

EncodedMatrix EncodedMatrix::from_bytes(WeightDtype dtype, std::size_t n, std::size_t k, const std::uint8_t* in) {
  EncodedMatrix m{dtype, n, k, {}, {}};
  const std::size_t c = code_bytes(dtype, n, k), s = scale_bytes(dtype, n, k);
  m.codes.assign(in, in + c);
  m.scales.assign(in + c, in + c + s);
  return m;
}

EncodedMatrix encode(WeightDtype dtype, const float* w, std::size_t n, std::size_t k) {
  MOED_CHECK(dtype != WeightDtype::mxfp4 || k % kBlock == 0, "mxfp4 rows of {} weights (a multiple of 32 needed)", k);
  EncodedMatrix m{dtype, n, k, std::vector<std::uint8_t>(EncodedMatrix::code_bytes(dtype, n, k)),
                  std::vector<std::uint8_t>(EncodedMatrix::scale_bytes(dtype, n, k))};
  auto amax = [&](std::size_t r0, std::size_t r1, std::size_t c0, std::size_t c1) {
    float a = 0;
    for (std::size_t i = r0; i < r1; ++i)
      for (std::size_t j = c0; j < c1; ++j) a = std::max(a, std::fabs(w[i * k + j]));
    return a;
  };
  switch (dtype) {
    case WeightDtype::f32:
      std::memcpy(m.codes.data(), w, 4 * n * k);
      break;
    case WeightDtype::bf16:
      for (std::size_t i = 0; i < n * k; ++i) {
        const std::uint16_t code = bf16_code(w[i]);
        std::memcpy(m.codes.data() + 2 * i, &code, 2);
      }
      break;
    case WeightDtype::fp8:
      for (std::size_t ti = 0; ti < ceil_div(n, kTile); ++ti)
        for (std::size_t tj = 0; tj < ceil_div(k, kTile); ++tj) {
          const std::size_t r1 = std::min(n, (ti + 1) * kTile), c1 = std::min(k, (tj + 1) * kTile);
          const float a = amax(ti * kTile, r1, tj * kTile, c1), s = a > 0 ? a / kFp8Max : 1.0f;
          store_f32(m.scales.data() + 4 * (ti * ceil_div(k, kTile) + tj), s);
          for (std::size_t i = ti * kTile; i < r1; ++i)
            for (std::size_t j = tj * kTile; j < c1; ++j) m.codes[i * k + j] = fp8_code(w[i * k + j] / s);
        }
      break;
    case WeightDtype::int8:
      for (std::size_t i = 0; i < n; ++i) {
        const float a = amax(i, i + 1, 0, k), s = a > 0 ? a / 127.0f : 1.0f;
        store_f32(m.scales.data() + 4 * i, s);
        for (std::size_t j = 0; j < k; ++j)
          m.codes[i * k + j] = std::uint8_t(std::int8_t(std::clamp(std::nearbyint(w[i * k + j] / s), -127.0f, 127.0f)));
      }
      break;
    case WeightDtype::mxfp4:
      for (std::size_t i = 0; i < n; ++i)
        for (std::size_t b = 0; b < k / kBlock; ++b) {
          const std::uint8_t e = mx_scale_code(amax(i, i + 1, b * kBlock, (b + 1) * kBlock));
          m.scales[i * (k / kBlock) + b] = e;
          const float s = e8m0_value(e);
          for (std::size_t j = b * kBlock; j < (b + 1) * kBlock; ++j)
            m.codes[i * k / 2 + j / 2] |= std::uint8_t(fp4_code(w[i * k + j] / s) << (4 * (j % 2)));
        }
      break;
  }
  return m;
}

EncodedMatrix rows_of(const EncodedMatrix& m, std::size_t r0, std::size_t r1) {
  const std::size_t grain = row_grain(m.dtype);
  MOED_CHECK(r0 <= r1 && r1 <= m.n && r0 % grain == 0 && (r1 % grain == 0 || r1 == m.n),
             "rows [{}, {}) of a {} matrix of {} rows", r0, r1, to_string(m.dtype), m.n);
  const std::size_t row = row_code_bytes(m.dtype, m.k);
  EncodedMatrix out{m.dtype, r1 - r0, m.k, grid_rows(m.codes, row, r0, r1), {}};
  switch (m.dtype) {
    case WeightDtype::fp8:
      out.scales = grid_rows(m.scales, 4 * ceil_div(m.k, kTile), r0 / kTile, ceil_div(r1, kTile));
      break;
    case WeightDtype::int8:
      out.scales = grid_rows(m.scales, 4, r0, r1);
      break;
    case WeightDtype::mxfp4:
      out.scales = grid_rows(m.scales, m.k / kBlock, r0, r1);
      break;
    case WeightDtype::f32:
    case WeightDtype::bf16:
      break;
  }
  return out;
}

EncodedMatrix columns_of(const EncodedMatrix& m, std::size_t c0, std::size_t c1) {
  const std::size_t grain = column_grain(m.dtype);
  MOED_CHECK(c0 <= c1 && c1 <= m.k && c0 % grain == 0 && (c1 % grain == 0 || c1 == m.k),
             "columns [{}, {}) of a {} matrix of {} columns", c0, c1, to_string(m.dtype), m.k);
  EncodedMatrix out{m.dtype, m.n, c1 - c0, {}, {}};
  switch (m.dtype) {
    case WeightDtype::f32:
      out.codes = grid_columns(m.codes, m.k, 4, c0, c1);
      break;
    case WeightDtype::bf16:
      out.codes = grid_columns(m.codes, m.k, 2, c0, c1);
      break;
    case WeightDtype::fp8:
      out.codes = grid_columns(m.codes, m.k, 1, c0, c1);
      out.scales = grid_columns(m.scales, ceil_div(m.k, kTile), 4, c0 / kTile, ceil_div(c1, kTile));
      break;
    case WeightDtype::int8:
      out.codes = grid_columns(m.codes, m.k, 1, c0, c1);
      out.scales = m.scales;
      break;
    case WeightDtype::mxfp4:
      out.codes = grid_columns(m.codes, m.k / 2, 1, c0 / 2, c1 / 2);
      out.scales = grid_columns(m.scales, m.k / kBlock, 1, c0 / kBlock, c1 / kBlock);
      break;
  }
  return out;
}

EncodedMatrix stack(const EncodedMatrix& a, const EncodedMatrix& b) {
  MOED_CHECK(a.dtype == b.dtype && a.k == b.k && a.n % row_grain(a.dtype) == 0,
             "stacking {} [{}, {}] on {} [{}, {}]", to_string(a.dtype), a.n, a.k, to_string(b.dtype), b.n, b.k);
  EncodedMatrix out = a;
  out.n += b.n;
  out.codes.insert(out.codes.end(), b.codes.begin(), b.codes.end());
  out.scales.insert(out.scales.end(), b.scales.begin(), b.scales.end());
  return out;
}

}  // namespace moed::kernels
