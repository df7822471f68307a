// The int8 dot-product tile (int8_dot_tile.h) for AVX-512 VNNI: a panel's
// four k steps of 16 s8 codes (64 bytes, k-major) become each lane's four
// consecutive codes with one byte permute (VBMI), offset to u8 (code + 128),
// and vpdpbusd adds the four u8 x s8 products of a lane to its int32 sum,
// the row's s8 activations broadcast from memory inside the instruction. Compiled with
// -mavx512vnni and VBMI, called only where the CPU has both; includes
// nothing but the intrinsics and int8_dot_tile.h.
#include <immintrin.h>

#include "kernels/cpu/fixed_order_tile.h"
#include "kernels/cpu/int8_dot_tile.h"

namespace moed::kernels::detail {
namespace {

__mmask64 first_bytes(std::size_t count) { return count >= 64 ? ~__mmask64(0) : (__mmask64(1) << count) - 1; }

// Byte 4 l + s of the result is step s's code of lane l.
__m512i lane_major() {
  alignas(64) unsigned char idx[64];
  for (int j = 0; j < 64; ++j) idx[j] = static_cast<unsigned char>((j % 4) * 16 + j / 4);
  return _mm512_load_si512(idx);
}

// Four panels (64 columns) x up to 6 rows: each broadcast row feeds four
// products, 24 accumulators.
#define MOED_ROW_CELLS(X, p) X(p, 0) X(p, 1) X(p, 2) X(p, 3) X(p, 4) X(p, 5)
#define MOED_CELLS(X) MOED_ROW_CELLS(X, 0) MOED_ROW_CELLS(X, 1) MOED_ROW_CELLS(X, 2) MOED_ROW_CELLS(X, 3)

template <int Rows>
struct Tile {
  static void run(const Int8TileArgs& g) {
    const __m512i transpose = lane_major(), offset = _mm512_set1_epi8(char(0x80));
#define MOED_DECLARE(p, r) __m512i acc##p##r = _mm512_setzero_si512();
    MOED_CELLS(MOED_DECLARE)
#undef MOED_DECLARE
    if (!g.first) {
#define MOED_LOAD(p, r) \
  if constexpr ((r) < Rows) acc##p##r = _mm512_loadu_si512(g.c + (r) * g.ldc + 16 * (p));
      MOED_CELLS(MOED_LOAD)
#undef MOED_LOAD
    }
    // A missing panel reads panel 0 again; its columns are the caller's padding.
    const std::uint8_t* panel[4];
    for (int p = 0; p < 4; ++p) panel[p] = g.panels[p] ? g.panels[p] : g.panels[0];
    for (std::size_t s = 0; s < g.kc; s += 4) {
      const __mmask64 mask = first_bytes(16 * (g.kc - s));
      // Missing steps load as code 0 and become 128: their activations are 0.
      const auto load = [&](const std::uint8_t* codes) __attribute__((always_inline)) {
        if (g.prepared) return _mm512_load_si512(codes + 16 * s);
        return _mm512_xor_si512(_mm512_permutexvar_epi8(transpose, _mm512_maskz_loadu_epi8(mask, codes + 16 * s)),
                                offset);
      };
      const __m512i w0 = load(panel[0]), w1 = load(panel[1]), w2 = load(panel[2]), w3 = load(panel[3]);
      const std::uint32_t* x = g.a + (s / 4) * Rows;
#define MOED_ROW(r)                                      \
  if constexpr ((r) < Rows) {                              \
    const __m512i x##r = _mm512_set1_epi32(int(x[(r)]));   \
    acc0##r = _mm512_dpbusd_epi32(acc0##r, w0, x##r);    \
    acc1##r = _mm512_dpbusd_epi32(acc1##r, w1, x##r);    \
    acc2##r = _mm512_dpbusd_epi32(acc2##r, w2, x##r);    \
    acc3##r = _mm512_dpbusd_epi32(acc3##r, w3, x##r);    \
  }
      MOED_ROW(0) MOED_ROW(1) MOED_ROW(2) MOED_ROW(3) MOED_ROW(4) MOED_ROW(5)
#undef MOED_ROW
    }
#define MOED_STORE(p, r) \
  if constexpr ((r) < Rows) _mm512_storeu_si512(g.c + (r) * g.ldc + 16 * (p), acc##p##r);
    MOED_CELLS(MOED_STORE)
#undef MOED_STORE
  }
};
#undef MOED_CELLS
#undef MOED_ROW_CELLS

void tile_any(const Int8TileArgs& g) { run_rows<Tile, 6>(g.rows, g); }

void prepare(const std::uint8_t* codes, std::size_t kc, std::uint8_t* out) {
  const __m512i transpose = lane_major(), offset = _mm512_set1_epi8(char(0x80));
  for (std::size_t s = 0; s < kc; s += 4)
    _mm512_store_si512(out + 16 * s,
                       _mm512_xor_si512(_mm512_permutexvar_epi8(
                                            transpose, _mm512_maskz_loadu_epi8(first_bytes(16 * (kc - s)), codes + 16 * s)),
                                        offset));
}

}  // namespace

Int8Kernels avx512_vnni_int8_kernels() { return {tile_any, prepare, 6}; }

}  // namespace moed::kernels::detail
