// The GEMM over compact weights in AMX's arithmetic ([experts].products =
// amx): the activations are rounded to bf16 as for the bf16 products, and
// every 32 k steps are one tile product, as TDPBF16PS computes it (Intel
// since Sapphire Rapids). A tile multiplies 16 rows by 16 columns over 32
// steps in one instruction, about 8x the AVX-512 BF16 rate per core.
//
// The bits of C[i][j] over the k range [k_begin, k_end), measured on the
// hardware (the manual's pseudocode leaves the order out) and written out by
// the portable loops:
//   x = bf16(A[i][k]), round to nearest even, 0 past the range's end;
//   w = the weight's code value in bf16 (exact in every format), 0 past it;
//     mxfp4: the code value times its block's scale 2^(e - 127), the top
//     half of the fp32 product (exact, but past fp32's range: inf; below
//     its normal range: read as 0 like any subnormal);
//   the range cut into blocks of 32 steps from its first column; per block,
//     two chains from +0 over its 16 pairs, E of the even steps and O of the
//     odd ones, each step one fma rounded to nearest even; then T = E + O;
//   bf16, int8, mxfp4: C = C + T block by block from +0 (int8: then
//     C x scale[j]);
//   fp8 (128-step scale blocks): S = S + T from +0 over the scale block,
//     C = fma(S, scale, C) scale block by scale block from +0;
//   every input and result of the chains and sums subnormal is read or
//     written as 0 (DAZ, FTZ), as the tiles do; the fma with the scale is an
//     ordinary fp32 fma.
// A row's bits depend on nothing but the row and W: not on its batch, its
// position, or whether the tiles or the portable loops ran. They differ from
// the bf16 products' (one chain of vdpbf16ps pairs): a run compares bit for
// bit only with equal products. The accuracy is the bf16 products' (the
// same rounded activations, exact products, fp32 sums).
#pragma once

#include <cstddef>

#include "kernels/cpu/fixed_order_gemm.h"
#include "kernels/cpu/quant_weights.h"

namespace moed::kernels {

// Whether this CPU and kernel run the tiles: AMX-TILE and AMX-BF16, the OS
// saving the tile state (XCR0) and granting it to this process (Linux's
// arch_prctl), and AVX-512 BF16 and VBMI for the decoders (cpu_has_bf16_dot).
// Elsewhere the amx products run as portable loops: the same bits, many
// times slower.
bool cpu_has_amx();

// C[m, n] = A[m, k] · Wᵀ over [k_begin, k_end) in the order above (a points
// at the range's first column, as in gemm_fixed_order_range). fp8 and mxfp4
// ranges start on a scale block. Runs the tiles where cpu_has_amx() and
// gemm_isa() is avx512 (at a few rows, AVX-512 decode tiles that give
// their bits with fmas: amx_tile.h), else the portable loops.
void gemm_amx_range(const float* a, std::size_t m, const QuantWeights& w, std::size_t k_begin, std::size_t k_end,
                    float* c, std::size_t lda = 0, std::size_t ldc = 0);

// The start-up probe: a row's bits at every position and batch size tried,
// against the portable loops on the row alone.
InvarianceProbe probe_amx_invariance(WeightDtype dtype, std::size_t n, std::size_t k);

}  // namespace moed::kernels
