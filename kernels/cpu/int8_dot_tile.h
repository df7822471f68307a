// The inner kernels of the int8 dot-product GEMM (int8_dot_gemm.h): u8
// activations against a panel's s8 codes, four k steps per 32-bit lane, with
// exact int32 sums. One portable set and one for AVX-512 VNNI; integers add
// exactly, so they agree whatever their order. Like fixed_order_tile.h, this
// header includes nothing but <cstddef> and <cstdint>.
#pragma once

#include <cstddef>
#include <cstdint>

namespace moed::kernels::detail {

// C[rows, 64] as int32 sums (rows ldc apart), continued or (first) started,
// over the steps [0, kc) of four panels' codes (each: its 16 lanes' s8 codes
// k-major, from the block's first step; null past the matrix's last panel,
// whose columns of C are then written with anything):
//   acc[r][16 p + l] += sum_s a[r][s] * (code_p[s][l] + 128)
// a[t * rows + r] holds the row's four s8 activations of steps 4t..4t+3,
// low byte first (0 past kc). The caller takes 128 x the row's sum of
// activations off: vpdpbusd multiplies u8 (the codes, offset) by s8.
// With `prepared`, panels point at prepare()'s output instead of codes.
struct Int8TileArgs {
  const std::uint8_t* const* panels;
  std::size_t kc;
  bool prepared;
  const std::uint32_t* a;
  std::size_t rows;
  std::int32_t* c;
  std::size_t ldc;
  bool first;
};
using Int8Tile = void (*)(const Int8TileArgs& args);
// A panel's steps [0, kc) as the tile multiplies them, once for every tile
// of rows: quad t's 64 bytes lane-major (byte 4 l + s: step 4 t + s of lane
// l), each code + 128; 0 past kc. out is 64-byte aligned.
using Int8Prepare = void (*)(const std::uint8_t* codes, std::size_t kc, std::uint8_t* out);

constexpr std::size_t kInt8TilePanels = 4;

// mxfp4 codes: the steps [0, kc) of a panel (in groups of 8 steps,
// quant_tile.h's layout) as prepare() lays int8 codes out, each code
// 2 x its e2m1 value (an integer in [-12, 12]) + 128. kc a multiple of 32.
using Fp4Prepare = void (*)(const std::uint8_t* codes, std::size_t kc, std::uint8_t* out);

// The same products over prepared mxfp4 panels, in scale blocks of 32 steps
// (8 quads): per block b a sum from 0, S = acc - offsets[r][b]
// (the caller's 128 x the row's block sum of activations), then
// out[r][16 p + l] = fma(float(S), scales[p][16 b + l], out), from +0 at the
// first block when `first`. out is fp32, rows ldc apart, 64 columns.
struct Fp4TileArgs {
  const std::uint8_t* const* panels;  // prepared, 4 of them (the missing ones: any prepared panel)
  const float* const* scales;         // per panel, 16 per block
  std::size_t blocks;
  const std::uint32_t* a;
  const std::int32_t* offsets;  // offsets[r * offsets_stride + b]
  std::size_t offsets_stride;
  std::size_t rows;
  float* out;
  std::size_t ldc;
  bool first;
  // The fused tile's instead of scales: per panel, its e8m0 bytes from the
  // range's first block (16 per block), which the tile widens and halves
  // itself, as e8m0_values(..., 0.5) does.
  const std::uint8_t* const* exps = nullptr;
};
using Fp4Tile = void (*)(const Fp4TileArgs& args);

// At up to kFp4FusedRows rows (decode): the same over raw mxfp4 codes (the
// panels at the range's first step), each quad decoded in registers as the
// tile reaches it: no prepared buffer, four streams of weights in flight.
constexpr std::size_t kFp4FusedRows = 3;

// A row's quantization (int8_dot_gemm.h): q[s] = round-to-even(x[s] x
// (127 / amax)) for s < k, *sum = their sum; returns amax / 127 (NaN, and q
// and *sum anything, when the row holds a NaN or an infinity).
using Int8Quantize = float (*)(const float* x, std::size_t k, std::int8_t* q, std::int32_t* sum);

// The int8 products' last step: c[r ldc + j] = (float(sums[r ld + j] - 128
// row_sum[r]) x row_scale[r]) x col_scale[j] for r < rows, j < cols: two
// roundings, in that order.
struct Int8FinishArgs {
  const std::int32_t* sums;
  std::size_t ld;
  std::size_t rows, cols;
  const std::int32_t* row_sum;
  const float* row_scale;
  const float* col_scale;
  float* c;
  std::size_t ldc;
};
using Int8Finish = void (*)(const Int8FinishArgs& args);

struct Int8Kernels {
  Int8Tile tile;  // up to tile_rows rows of kInt8TilePanels panels
  Int8Prepare prepare;
  std::size_t tile_rows;
  Fp4Prepare prepare_fp4;
  Fp4Tile fp4_tile;   // up to tile_rows rows of kInt8TilePanels prepared panels
  Fp4Tile fp4_fused = nullptr;  // up to kFp4FusedRows rows of kInt8TilePanels raw panels
  Int8Quantize quantize = nullptr;  // null: the portable loop
  Int8Finish finish = nullptr;      // null: the portable loop
};
Int8Kernels portable_int8_kernels();
Int8Kernels avx512_vnni_int8_kernels();  // only where the CPU has AVX-512 VNNI, BW and VBMI

}  // namespace moed::kernels::detail
