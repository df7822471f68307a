// The GEMM over compact weights with bf16 dot products ([experts].products =
// bf16): the activations are rounded to bf16, every weight's code value
// (exact in bf16 in every format) meets them two k steps at a time as
// AVX-512 BF16's vdpbf16ps multiplies them, and the format's scales apply
// to fp32 partial sums. About twice the fp32 FMA rate, and fewer
// instructions to decode a weight.
//
// The bits of C[i][j] (bf16_dot_tile.h gives each step exactly):
//   x = bf16(A[i][k]), round to nearest even, for the row alone;
//   the chain over k pairs (2t, 2t + 1) from the range's first column, each
//     pair as vdpbf16ps adds it (odd product first, subnormals flushed);
//   bf16: C = the chain over the whole range;
//   int8: C = chain x scale[j], one fp32 multiply;
//   fp8 (128-step scale blocks) and mxfp4 (32): a chain from +0 per block,
//     C = fma(chain, scale, C) block by block from +0.
// A row's bits depend on nothing but the row and W: not on its batch, its
// position, the tiles, or whether AVX-512 BF16 or the portable loops ran.
// What it costs: an activation keeps 8 significant bits, not 24 (relative
// error up to 2^-9 each); docs/weight-formats.md measures the effect.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "kernels/cpu/fixed_order_gemm.h"
#include "kernels/cpu/quant_weights.h"

namespace moed::kernels {

// How compact weights multiply: f32 = each weight's value (scale applied)
// times the fp32 activation, the fp32 fma chain of quant_weights.h; bf16 =
// the above; int8 = int8 weights against activations quantized to 8 bits
// (int8_dot_gemm.h), other formats as bf16; amx = bf16 activations in AMX
// tile products of 32 steps (amx_gemm.h).
enum class CompactProducts { f32, bf16, int8, amx };
const char* to_string(CompactProducts products);
// Whether this CPU runs the bf16 products in hardware: AVX-512 F, BW, VL,
// VBMI and BF16 (Zen 4, Intel since Sapphire Rapids; Cooper Lake lacks VBMI).
// Elsewhere they run as portable loops, with the same bits, many times slower.
bool cpu_has_bf16_dot();
// The products gemm_fixed_order on QuantWeights uses from now on (the daemon
// sets it once at start-up from [experts].products; f32 until then).
void set_compact_products(CompactProducts products);
CompactProducts compact_products();

// C[m, n] = bf16(A[m, k]) · Wᵀ over the k range [k_begin, k_end) (a points
// at the range's first column, as in gemm_fixed_order_range), in the order
// above. fp8 and mxfp4 ranges start on a scale block (128, 32 steps).
// Runs the AVX-512 BF16 kernels where the CPU has them and gemm_isa() is
// avx512, else the portable ones.
void gemm_bf16_dot_range(const float* a, std::size_t m, const QuantWeights& w, std::size_t k_begin,
                         std::size_t k_end, float* c, std::size_t lda = 0, std::size_t ldc = 0);

// The start-up probe: a row's bits at every position and batch size tried,
// against the portable loops on the row alone.
InvarianceProbe probe_bf16_dot_invariance(WeightDtype dtype, std::size_t n, std::size_t k);

namespace detail {
// The steps of one scale block: fp8 128, mxfp4 32, 0 for formats without.
std::size_t block_steps(WeightDtype dtype);
// The rows of the tile that starts at row i of `rows`: the rows split into
// as few tiles of at most tile_rows as they fill, as evenly as they go
// (256 rows by 12: 14 tiles of 12 and 8 of 11, not 21 of 12 and one of 4,
// whose few chains left the core idle for 5% of a prefill's time). The
// packing of the rows and the tiles over them follow it alike; no bit
// depends on it, a row's chains being its own.
std::size_t even_tile_rows(std::size_t i, std::size_t rows, std::size_t tile_rows);
// The codes of steps [k0, k0 + kc) of the `count` panels from p (those that
// exist), share j of `shares`: fetched a share per tile while the tiles
// before them run, so that their decode or preparation finds them in cache.
void prefetch_share(const QuantWeights& w, std::size_t p, std::size_t count, std::size_t k0, std::size_t kc,
                    std::size_t j, std::size_t shares);
// The scale of each block of panel p's steps [k0, k0 + kc), 16 lanes each
// (out[16 b + lane]); k0 on a block.
void block_scales(const QuantWeights& w, std::size_t p, std::size_t k0, std::size_t kc, float* out);
// A group of whole panels that a decode tile runs side by side (the bf16
// products' and the amx products' fused tiles): panels [p, p + count) of w,
// count <= kMaxGroupPanels, and, with_scales, each one's block_scales over
// the steps [k0, k0 + kc), in buffers of this thread's that the next call
// overwrites (null scales without).
constexpr std::size_t kMaxGroupPanels = 4;
struct PanelGroup {
  QuantPanel panels[kMaxGroupPanels];
  const float* scales[kMaxGroupPanels] = {};
};
PanelGroup panel_group(const QuantWeights& w, std::size_t p, std::size_t count, std::size_t k0, std::size_t kc,
                       bool with_scales);
// int8 weights: each output channel's (row of W's) fp32 scale, in a buffer of
// this thread's that the next call overwrites.
const std::vector<float>& column_scales(const QuantWeights& w);
// int8 weights: C[i][j] *= scale[j], a row's scale once at the end of its chain.
void apply_row_scales(const QuantWeights& w, std::size_t m, float* c, std::size_t ldc);
}  // namespace detail

}  // namespace moed::kernels
