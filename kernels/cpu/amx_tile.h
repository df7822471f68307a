// The inner kernel of the AMX GEMM (amx_gemm.h): up to 2 x 2 tiles of 16
// rows by 16 columns over a chunk of 32-step blocks. One portable set (the
// definition) and one of AMX instructions, which give the same bits. Like
// bf16_dot_tile.h, this header includes nothing but plain declarations, so
// the AMX file compiles no shared inline function.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/cpu/bf16_dot_tile.h"

namespace moed::kernels::detail {

constexpr std::size_t kAmxBlock = 32;  // k steps in one tile product
constexpr std::size_t kAmxRows = 16;   // rows of a tile (and columns: a panel)
constexpr std::size_t kAmxLdc = 32;    // floats per row of the accumulators: two panels

// The activations as the tiles read them (AmxPack's layout): rows in tiles
// of 16, each tile's steps in blocks of 32, each block one tile of 16 rows x
// 64 bytes, contiguous: row r, step s at
//   (r / 16) x 16 k_pad + (s / 32) x 512 + (r % 16) x 32 + s % 32
// (k_pad: the steps rounded up to a block). A tile load then reads 1 KB in
// a row, which the prefetchers follow, not 16 lines a row apart.
constexpr std::size_t amx_packed_at(std::size_t r, std::size_t s, std::size_t k_pad) {
  return r / kAmxRows * kAmxRows * k_pad + s / kAmxBlock * kAmxRows * kAmxBlock + r % kAmxRows * kAmxBlock +
         s % kAmxBlock;
}

struct AmxTileArgs {
  // 16 x row_tiles rows of bf16 activations in AmxPack's layout, from the
  // chunk's first block (row tile 0), 0 past the range (rows past the
  // batch: any); row tile 1 a_tile elements further (16 k_pad).
  const std::uint16_t* a;
  std::size_t a_tile;
  std::size_t row_tiles;  // 1 or 2
  // Each panel's pairs for the chunk in bf16_dot_tile.h's layout (a block's
  // 16 pairs of 16 lanes are one tile of 16 x 64 bytes), 0 past the range.
  const std::uint16_t* b[2];
  std::size_t panels;  // 1 or 2
  std::size_t blocks;  // 32-step blocks in the chunk
  // 0: C = C + T over every block (bf16, int8, mxfp4). Else blocks per scale
  // block (fp8: 4): S from +0 over them, C = fma(S, scales[q][16 s + lane], C).
  std::size_t group;
  const float* scales[2];
  // The accumulators: 16 x row_tiles rows, ldc floats apart, panel q's
  // lanes at 16 q; from +0 when first (the range's first chunk).
  float* c;
  std::size_t ldc;
  bool first;
};
using AmxTile = void (*)(const AmxTileArgs& args);
// The rows as the tiles read them: out[amx_packed_at(i, j, k_pad)] =
// bf16_code(a[i lda + j]) for i < m, j < k, 0 for k <= j < k_pad (a
// multiple of 32); rows from m to the next 16 untouched.
using AmxPack = void (*)(const float* a, std::size_t lda, std::size_t m, std::size_t k, std::size_t k_pad,
                         std::uint16_t* out);
// mxfp4: each decoded code value w of pair row t, lane l becomes the top
// half of fp32(w) x scales[16 (t / 16) + l] (the block's 2^(e - 127)):
// exact, but for values past fp32's range (inf) or below its normal range
// (subnormal, read as 0 by the tiles).
using AmxScalePairs = void (*)(std::uint16_t* pairs, std::size_t npairs, const float* scales);

// At up to amx_fused_rows() rows (decode): the tiles' bits without the tiles.
// Each panel's codes are decoded to pairs in registers (pair_codes_avx512.h)
// and each step of the E and O chains is one AVX-512 fma with MXCSR's DAZ
// and FTZ set: the step the definition (amx_gemm.h) names. T = E + O and
// C = C + T (fp8: S = S + T) run likewise; fp8's C = fma(S, scale, C) runs
// under the caller's MXCSR. A tile product costs the same at 1 row as at 16,
// these fmas in proportion to the rows.
struct AmxFusedArgs {
  // rows of activations as fp32 (each a bf16 value), x_stride apart, from
  // the range's first step, 0 past it to the end of its last 32-step block.
  const float* x;
  std::size_t x_stride;
  std::size_t rows;
  const QuantPanel* w;         // amx_fused_panels(rows) whole panels side by side
  std::size_t k0, kc;          // the range of steps [k0, k0 + kc)
  std::size_t group;           // as in AmxTileArgs
  const float* const* scales;  // fp8: panel i's, 16 per scale block of the range
  float* c;                    // C[rows, 16 x panels], ldc apart: written
  std::size_t ldc;
  // mxfp4: the e8m0 scales a block may apply to its chains' sums instead of
  // each weight, the bits the same (amx_chain_scales); from > to: none.
  std::uint8_t chain_scales_from = 1, chain_scales_to = 0;
  // The same rows as the tiles read them (AmxPack's layout, from the
  // range's first block), for an AMX CPU's tiles (avx512_amx_fused_tile).
  const std::uint16_t* packed = nullptr;
};
// mxfp4 in the decode tiles: a block's chains over the unscaled code values,
// times 2^(e - 127) at the block's end, give the bits of the chains over the
// scaled values when no value on either way leaves fp32's normal range
// (scaling by a power of two then commutes with every rounding). With the
// rows' activations x (bf16 values; t the exponent of the smallest nonzero
// normal |x|, X the largest |x|) that holds for 2^(e - 127) = 2^s when:
//   every scaled code is normal: 0.5 x 2^s >= 2^-126 and 6 x 2^s < 2^128;
//   no nonzero sum falls below 2^-126: products x c are multiples of
//     2^(t - 8) (8 bits of x, c a multiple of 1/2), and so is every rounded
//     sum of them; 2^(t - 8) and 2^(t - 8 + s) >= 2^-126;
//   none overflows: |a sum| <= 32 x 6 X (1 + 2^-18), and 2^s times that,
//     below fp32's largest.
// Returns {from, to} (from > to: no scale qualifies), any NaN or infinity
// in x leaving none.
struct ChainScales {
  std::uint8_t from, to;
};
ChainScales amx_chain_scales(const float* x, std::size_t count);
using AmxFusedTile = void (*)(const AmxFusedArgs& args);
// The most rows at which the decode tiles ran faster than the tiles
// (DeepSeek-V3's W1|W3 on a Xeon with AMX, 1 to 8 rows): bf16 and int8 up
// to 3 (at 4 the tiles ran 1.1x), fp8 up to 4 (even there), mxfp4 up to 8
// (1.3x there, 3x at 1 row: its scales cost the tiles a pass of their own;
// with AMX, mxfp4's rows and the others' from 3 now run on the tiles, their
// pairs decoded in registers to an L1 buffer: avx512_amx_fused_tile).
constexpr std::size_t kAmxFusedRows = 8;
constexpr std::size_t amx_fused_rows(QuantPanel::Kind kind) {
  return kind == QuantPanel::mxfp4 ? kAmxFusedRows : kind == QuantPanel::fp8 ? 4 : 3;
}
constexpr std::size_t amx_fused_panels(std::size_t rows) { return rows <= 2 ? 4 : rows <= 4 ? 2 : 1; }
constexpr std::size_t kAmxFusedPanels = amx_fused_panels(1);  // the most side by side

struct AmxKernels {
  PairDecoder decode;
  AmxScalePairs scale_pairs;
  AmxPack pack;
  AmxTile tile;
  void (*enter)();               // before a GEMM's tiles on this thread (the tile configuration)
  void (*leave)();               // after them (the tile state released)
  AmxFusedTile fused = nullptr;  // rows <= amx_fused_rows(kind); null: the tiles at every size
};
// The int8 products (int8_dot_gemm.h) on AMX-INT8's TDPBSUD: s8
// activations, 16 rows x 64 steps a tile, against weights as int8's
// prepare() lays them out (int8_dot_tile.h: 16 quads of 16 lanes, each code
// + 128, one tile of 16 x 64 bytes per 64 steps), in exact int32 sums:
//   c[r][16 q + l] (+)= sum over the blocks' steps of a[r][s] (code + 128).
// Integers add exactly, so these equal the int8 products' own bits.
struct AmxInt8Args {
  // 16 x row_tiles rows, 0 past the range, from the chunk's first block:
  // each 64-step block of a row tile one tile of 16 rows x 64 bytes,
  // contiguous (amx_int8_packed_at); row tile 1 a_tile bytes on.
  const std::int8_t* a;
  std::size_t a_tile;
  std::size_t row_tiles;  // 1 or 2
  const std::uint8_t* b[2];
  std::size_t panels;  // 1 or 2
  std::size_t blocks;  // 64-step blocks
  std::int32_t* c;     // 16 x row_tiles rows of kAmxLdc sums
  bool first;          // from 0
};
using AmxInt8Tile = void (*)(const AmxInt8Args& args);
constexpr std::size_t kAmxInt8Block = 64;  // k steps in one AMX-INT8 tile product
constexpr std::size_t amx_int8_packed_at(std::size_t r, std::size_t s, std::size_t k_pad) {
  return r / kAmxRows * kAmxRows * k_pad + s / kAmxInt8Block * kAmxRows * kAmxInt8Block +
         r % kAmxRows * kAmxInt8Block + s % kAmxInt8Block;
}
// Only where cpu_has_amx() and cpu_reports_amx_int8(); run between the
// AmxKernels' enter() and leave().
AmxInt8Tile amx_int8_tile();
bool cpu_reports_amx_int8();  // CPUID's AMX-INT8 (the OS state as for cpu_reports_amx)

AmxKernels portable_amx_kernels();
// Only where cpu_has_amx().
AmxKernels amx_tile_kernels();
// Only where the CPU has AVX-512 F, BW, VL, VBMI and BF16 (cpu_has_bf16_dot);
// with_tiles only where it has AMX too: mxfp4 (where its scales allow) and,
// from 3 rows, the other formats then run on the tiles, decoding in registers.
AmxFusedTile avx512_amx_fused_tile(bool with_tiles);
// The CPU has AMX-TILE and AMX-BF16 and the OS saves their state (CPUID, XCR0).
bool cpu_reports_amx();
// Asks Linux for the tile data state for this process (once; true if granted).
bool request_amx_state();

}  // namespace moed::kernels::detail
