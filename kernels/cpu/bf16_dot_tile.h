// The inner kernels of the bf16 dot-product GEMM over compact weights
// (bf16_dot_gemm.h): a panel's weights decoded to bf16 pairs, and tiles that
// multiply them with activations rounded to bf16. One portable set (the
// definition) and one for AVX-512 BF16, which give the same bits. Like
// fixed_order_tile.h, this header includes nothing but <cstddef> and
// <cstdint>, so the AVX-512 file compiles no shared inline function.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/cpu/fixed_order_tile.h"
#include "kernels/cpu/quant_tile.h"

namespace moed::kernels::detail {

// A panel's steps [k0, k0 + 2 npairs) as bf16 pairs: out[32 t + 2 l + s] is
// the bf16 code of W[16 p + l][k0 + 2 t + s]'s code value (its scale is not
// applied; every format's code values are exact in bf16), 0 past kc steps.
// kc is the number of steps decoded; npairs = ceil(kc / 2).
using PairDecoder = void (*)(const QuantPanel& w, std::size_t k0, std::size_t kc, std::uint16_t* out);

// How a tile's chains meet the panel's scales:
//   block_pairs 0: one chain over all the tile's pairs, continuing C (or,
//     first, from +0); the caller scales C at the end (int8) or not (bf16);
//   block_pairs > 0: a chain from +0 per block of that many pairs (the last
//     may be shorter), then C = fma(chain, scales[16 b + l], C), C from +0
//     when first (fp8: 64 pairs; mxfp4: 16).
// Each chain step is what vdpbf16ps does to a lane:
//   acc = ftz(fma(x[2t+1], w[2t+1], daz(acc)));  acc = ftz(fma(x[2t], w[2t], acc))
// with inputs that are subnormal read as 0 (DAZ) and subnormal results
// flushed to 0 (FTZ), each fma rounded once, to nearest even.
struct DotTileArgs {
  const std::uint32_t* a;  // the tile's activations: a[t * rows + r] = x[2t] | x[2t+1] << 16, as bf16
  std::size_t rows;
  std::size_t npairs;
  std::size_t block_pairs;
  const float* scales;  // 16 per block (block_pairs > 0)
  float* c;
  std::size_t ldc;
  bool first;
};
using DotTile = void (*)(const DotTileArgs& args, const std::uint16_t* pairs);
// The same over two panels side by side: C[rows, 32], pairs0's then pairs1's
// lanes; scales1 are panel 1's.
using DotPairTile = void (*)(const DotTileArgs& args, const std::uint16_t* pairs0, const std::uint16_t* pairs1,
                             const float* scales1);

// At up to 12 rows (decode), dot_fused_panels(rows) whole panels side by
// side (C[rows, 16 x that]), each pair decoded in registers as the tile
// reaches it: no buffer, several streams of weights in flight, 12 or more
// independent chains. The steps [k0, k0 + kc) of w[0..panels); scales[i]
// are panel i's for fp8 (block_pairs > 0); mxfp4's e8m0 bytes the tile
// reads from the panels itself.
using DotFusedTile = void (*)(const DotTileArgs& args, const QuantPanel* w, std::size_t k0, std::size_t kc,
                              const float* const* scales);
constexpr std::size_t kDotFusedRows = 12;
constexpr std::size_t dot_fused_panels(std::size_t rows) { return rows <= 3 ? 4 : rows <= 6 ? 2 : 1; }
constexpr std::size_t kDotFusedPanels = dot_fused_panels(1);  // the most side by side

struct DotKernels {
  PairDecoder decode;
  DotTile tile;
  std::size_t tile_rows;
  DotPairTile pair = nullptr;
  DotFusedTile fused = nullptr;  // rows <= kDotFusedRows
};
DotKernels portable_dot_kernels();
// Only where the CPU has AVX-512 F, BW, VBMI and BF16.
DotKernels avx512_bf16_dot_kernels();

}  // namespace moed::kernels::detail
