// The GEMM over int8 (and mxfp4) experts with int8 dot products
// ([experts].products = int8): each row's activations quantized to 8 bits, multiplied with the
// weights' s8 codes four k steps at a time as AVX-512 VNNI's vpdpbusd does,
// in exact int32 sums. About twice the bf16 products' rate, and what the
// CPU's int8 units are for; the price is the activations' precision.
//
// The bits of C[i][j] over the k range [k_begin, k_end) (a the range's
// first column, as in gemm_fixed_order_range):
//   amax = max |A[i][k]| over the range; inv = 127 / amax (fp32);
//   q[k] = round-to-even(A[i][k] * inv), in [-127, 127] (all 0 when amax 0);
//   acc = sum q[k] code[j][k], exact (computed as sum q (code + 128) minus
//         128 sum q: vpdpbusd multiplies u8 by s8);
//   C = (float(acc) * (amax / 127)) * scale[j], float(acc) rounded to
//       nearest even, each multiply rounded once, in that order.
// A row with a NaN or an infinity has every output NaN. The bits depend on
// the row and W alone: integers add exactly in any order, so no tile shape,
// batch or instruction set changes them.
#pragma once

#include <cstddef>

#include "kernels/cpu/quant_weights.h"

namespace moed::kernels {

// Whether this CPU runs the int8 products in hardware: AVX-512 F, BW, VBMI
// and VNNI (Zen 4, Intel since Ice Lake). Elsewhere, portable loops (same
// bits, many times slower).
bool cpu_has_int8_dot();

// mxfp4 weights take the same products per 32-step scale block: with q as
// above and v = 2 x each code's e2m1 value (an integer in [-12, 12]),
//   S_b = sum over the block's steps of q[k] v[j][k], exact;
//   total = fma(float(S_b), 2^(e_b - 128), total) block by block from +0
//           (2^(e - 128) is the e8m0 scale halved: exact);
//   C = total * (amax / 127).
//
// C[m, n] as above; w must hold int8 or mxfp4 codes (mxfp4: the range on
// 32-step blocks). Runs the AVX-512 VNNI tiles where the CPU has them and
// gemm_isa() is avx512, else the portable loops.
void gemm_int8_dot_range(const float* a, std::size_t m, const QuantWeights& w, std::size_t k_begin,
                         std::size_t k_end, float* c, std::size_t lda = 0, std::size_t ldc = 0);

// The start-up probe: a row's bits at every position and batch size tried,
// against the portable loops on the row alone.
InvarianceProbe probe_int8_dot_invariance(WeightDtype dtype, std::size_t n, std::size_t k);

}  // namespace moed::kernels
