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

struct Int8Kernels {
  Int8Tile tile;  // up to tile_rows rows of kInt8TilePanels panels
  Int8Prepare prepare;
  std::size_t tile_rows;
};
Int8Kernels portable_int8_kernels();
Int8Kernels avx512_vnni_int8_kernels();  // only where the CPU has AVX-512 VNNI, BW and VBMI

}  // namespace moed::kernels::detail
