// The fixed-order tiles over compact weights (quant_weights.h) that decode
// each k step's 16 weights in registers and multiply them at once: at a few
// rows per expert (decode), writing the decoded panel to memory and reading
// it back cost more than the weights' own bytes. Each weight's value is
// computed as quant_decode_body.h computes it, so the chain, and the bits,
// are those of the fp32 tiles on the decoded panel. Like fixed_order_tile.h,
// this header includes nothing but <cstddef> and <cstdint>.
#pragma once

#include <cstddef>
#include <cstdint>

namespace moed::kernels::detail {

// Where mxfp4's code of (step s, lane l) lies in a panel's codes (from a
// group's start): its byte, and the shift of its nibble in that byte.
// (static: no copy of these is shared with the files built for AVX-512.)
static constexpr std::size_t kFp4GroupSteps = 8, kFp4GroupBytes = 64;
static inline std::size_t fp4_code_byte(std::size_t s, std::size_t lane) {
  return s / kFp4GroupSteps * kFp4GroupBytes + 2 * (2 * lane + s % 2) + s % 8 / 4;
}
static inline unsigned fp4_code_shift(std::size_t s) { return 4 * (s % 8 / 2 % 2); }

// One panel as quant_weights.cc lays it out: 16 rows' codes k-major from
// step 0, and the panel's scales. mxfp4's codes go by groups of 8 steps
// (64 bytes, 32 little-endian 16-bit words): word 2 l + s % 2 holds, in
// its nibble (s % 8) / 2, the code of lane l at step s. So one word shift
// puts a k pair's 16 lanes x 2 steps in the low nibbles of the 32 words, in
// the order the bf16 products multiply them, and one table lookup (vpermw)
// decodes them; with a step's 16 codes side by side (8 bytes a step, as
// before) each pair took a byte gather, a word shift and the lookup.
struct QuantPanel {
  enum Kind { bf16, fp8, mxfp4, int8 } kind;
  const std::uint8_t* codes;
  const std::uint8_t* scales;
};

// C[rows, 16] (rows ldc apart) continues or (first) starts the chain of
// A[rows, kc] (packed k-major: a[kk * rows + r]) with the panel's steps
// [k0, k0 + kc). rows <= 12.
using QuantTileKernel = void (*)(const QuantPanel& w, std::size_t k0, const float* a, std::size_t rows,
                                 std::size_t kc, float* c, std::size_t ldc, bool first);
QuantTileKernel avx512_quant_tile();  // only where the CPU has AVX-512F and BW
constexpr std::size_t kQuantTileRows = 12;
// The same over four whole panels side by side (C[rows, 64]), rows <= 3:
// few rows leave too few independent chains to a panel alone.
using QuantTile4Kernel = void (*)(const QuantPanel (&w)[4], std::size_t k0, const float* a, std::size_t rows,
                                  std::size_t kc, float* c, std::size_t ldc, bool first);
QuantTile4Kernel avx512_quant_tile4();
constexpr std::size_t kQuantTile4Rows = 3;

}  // namespace moed::kernels::detail
