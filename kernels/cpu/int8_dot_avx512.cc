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
// One quad step of a row against four panels' codes w0..w3 (both 6-row
// tiles): x the step's packed activations, acc<panel><row> the sums.
#define MOED_ROW(r)                                        \
  if constexpr ((r) < Rows) {                              \
    const __m512i x##r = _mm512_set1_epi32(int(x[(r)]));   \
    acc0##r = _mm512_dpbusd_epi32(acc0##r, w0, x##r);      \
    acc1##r = _mm512_dpbusd_epi32(acc1##r, w1, x##r);      \
    acc2##r = _mm512_dpbusd_epi32(acc2##r, w2, x##r);      \
    acc3##r = _mm512_dpbusd_epi32(acc3##r, w3, x##r);      \
  }

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
      if (!g.prepared)  // raw codes stream from memory; prepared ones were just written
        for (const std::uint8_t* codes : panel)
          _mm_prefetch(reinterpret_cast<const char*>(codes + 16 * s + kPrefetchBytes), _MM_HINT_T0);
      const __m512i w0 = load(panel[0]), w1 = load(panel[1]), w2 = load(panel[2]), w3 = load(panel[3]);
      const std::uint32_t* x = g.a + (s / 4) * Rows;
      MOED_ROW(0) MOED_ROW(1) MOED_ROW(2) MOED_ROW(3) MOED_ROW(4) MOED_ROW(5)
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

// mxfp4: a group of 8 steps is 64 bytes (quant_tile.h: lane l's words
// 2 l and 2 l + 1, a step's nibble 4 ((s % 8) / 2) bits up in word
// 2 l + s % 2). Nibbles become bytes (2 v + 128) by a 16-entry table
// (vpshufb), and each quad's 64 bytes are gathered lane-major from the low-
// and high-nibble vectors (vpermi2b: bit 6 picks the high one).
struct Fp4Tables {
  alignas(64) unsigned char table[64], idx[2][64];
  Fp4Tables() {
    static constexpr int kTwice[8] = {0, 1, 2, 3, 4, 6, 8, 12};  // 2 x e2m1's magnitudes
    for (int j = 0; j < 64; ++j) {
      const int nibble = j % 16, v = kTwice[nibble & 7];
      table[j] = static_cast<unsigned char>((nibble & 8 ? -v : v) + 128);
      for (int u = 0; u < 2; ++u) {
        // Byte 4 l + s of quad u, step 4 u + s of lane l: nibble 2 u + s / 2
        // of word 2 l + s % 2, so byte u of that word, high if s / 2.
        const int l = j / 4, s = j % 4;
        idx[u][j] = static_cast<unsigned char>((s / 2) << 6 | (2 * (2 * l + s % 2) + u));
      }
    }
  }
};

void prepare_fp4(const std::uint8_t* codes, std::size_t kc, std::uint8_t* out) {
  static const Fp4Tables t;
  const __m512i lookup = _mm512_load_si512(t.table), quad0 = _mm512_load_si512(t.idx[0]),
                quad1 = _mm512_load_si512(t.idx[1]), low = _mm512_set1_epi8(0x0f);
  for (std::size_t s = 0; s < kc; s += 8) {
    const __m512i c = _mm512_loadu_si512(codes + 8 * s);
    const __m512i lo = _mm512_shuffle_epi8(lookup, _mm512_and_si512(c, low));
    const __m512i hi = _mm512_shuffle_epi8(lookup, _mm512_and_si512(_mm512_srli_epi16(c, 4), low));
    _mm512_store_si512(out + 16 * s, _mm512_permutex2var_epi8(lo, quad0, hi));
    _mm512_store_si512(out + 16 * s + 64, _mm512_permutex2var_epi8(lo, quad1, hi));
  }
}

// A scale block's exact sum into its fp32 total (int8_dot_tile.h):
// out = fma(float(acc - offset), scale, from_zero ? +0 : out).
inline void block_total(__m512i acc, std::int32_t offset, __m512 scale, float* out, bool from_zero) {
  const __m512 sum = _mm512_cvtepi32_ps(_mm512_sub_epi32(acc, _mm512_set1_epi32(offset)));
  _mm512_storeu_ps(out, _mm512_fmadd_ps(sum, scale, from_zero ? _mm512_setzero_ps() : _mm512_loadu_ps(out)));
}

// A block's 16 e8m0 bytes as halved scales, e8m0_values(e, 16, 0.5) in
// registers: 2^(e - 127) by its bits (0: 2^-127, 255: NaN), times 0.5.
inline __m512 half_scales(const std::uint8_t* e) {
  const __m512i codes = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(e)));
  const __mmask16 edge = _mm512_cmpeq_epi32_mask(codes, _mm512_setzero_si512()) |
                         _mm512_cmpeq_epi32_mask(codes, _mm512_set1_epi32(255));
  const __m512i bits = _mm512_slli_epi32(codes, 23);
  return _mm512_mul_ps(_mm512_castsi512_ps(_mm512_mask_or_epi32(bits, edge, bits, _mm512_set1_epi32(0x00400000))),
                       _mm512_set1_ps(0.5f));
}

// Both mxfp4 tiles end a block so (acc, from_zero, b: the tile's own;
// scale##p the block's scales of panel p).
#define MOED_SCALE(p, r)                                                                                        \
  if constexpr ((r) < Rows)                                                                                     \
    block_total(acc##p##r, g.offsets[(r) * g.offsets_stride + b], scale##p, g.out + (r) * g.ldc + 16 * (p), \
                from_zero);

#define MOED_ROW_CELLS(X, p) X(p, 0) X(p, 1) X(p, 2) X(p, 3) X(p, 4) X(p, 5)
#define MOED_CELLS(X) MOED_ROW_CELLS(X, 0) MOED_ROW_CELLS(X, 1) MOED_ROW_CELLS(X, 2) MOED_ROW_CELLS(X, 3)

template <int Rows>
struct Fp4Tile {
  static void run(const Fp4TileArgs& g) {
#define MOED_DECLARE(p, r) __m512i acc##p##r;
    MOED_CELLS(MOED_DECLARE)
#undef MOED_DECLARE
    for (std::size_t b = 0; b < g.blocks; ++b) {
#define MOED_ZERO(p, r) acc##p##r = _mm512_setzero_si512();
      MOED_CELLS(MOED_ZERO)
#undef MOED_ZERO
      for (std::size_t t = 8 * b; t < 8 * b + 8; ++t) {
        const __m512i w0 = _mm512_load_si512(g.panels[0] + 64 * t), w1 = _mm512_load_si512(g.panels[1] + 64 * t),
                      w2 = _mm512_load_si512(g.panels[2] + 64 * t), w3 = _mm512_load_si512(g.panels[3] + 64 * t);
        const std::uint32_t* x = g.a + t * Rows;
        MOED_ROW(0) MOED_ROW(1) MOED_ROW(2) MOED_ROW(3) MOED_ROW(4) MOED_ROW(5)
      }
      const bool from_zero = g.first && b == 0;
      const __m512 scale0 = _mm512_loadu_ps(g.scales[0] + 16 * b), scale1 = _mm512_loadu_ps(g.scales[1] + 16 * b),
                   scale2 = _mm512_loadu_ps(g.scales[2] + 16 * b), scale3 = _mm512_loadu_ps(g.scales[3] + 16 * b);
      MOED_CELLS(MOED_SCALE)
    }
  }
};
#undef MOED_CELLS
#undef MOED_ROW_CELLS
#undef MOED_ROW

void fp4_tile_any(const Fp4TileArgs& g) { run_rows<Fp4Tile, 6>(g.rows, g); }

// Raw mxfp4 codes, decoded as prepare_fp4 lays them out, in registers,
// prefetched into L2 2 KB ahead (as the bf16 products' fused tiles: into L1
// 1 KB ahead, one row from DRAM ran at 25 G weights/s on Zen 4, at 33-35
// this way).
constexpr std::size_t kFusedPrefetchBytes = 2048;
#define MOED_ROW_CELLS(X, p) X(p, 0) X(p, 1) X(p, 2)
#define MOED_CELLS(X) MOED_ROW_CELLS(X, 0) MOED_ROW_CELLS(X, 1) MOED_ROW_CELLS(X, 2) MOED_ROW_CELLS(X, 3)
template <int Rows>
struct Fp4Fused {
  static void run(const Fp4TileArgs& g) {
    static const Fp4Tables t;
    const __m512i lookup = _mm512_load_si512(t.table), quad0 = _mm512_load_si512(t.idx[0]),
                  quad1 = _mm512_load_si512(t.idx[1]), low = _mm512_set1_epi8(0x0f);
#define MOED_DECLARE(p, r) __m512i acc##p##r;
    MOED_CELLS(MOED_DECLARE)
#undef MOED_DECLARE
    for (std::size_t b = 0; b < g.blocks; ++b) {
#define MOED_ZERO(p, r) acc##p##r = _mm512_setzero_si512();
      MOED_CELLS(MOED_ZERO)
#undef MOED_ZERO
      for (std::size_t s = 32 * b; s < 32 * b + 32; s += 8) {  // two quads a panel
        const std::uint32_t* x = g.a + (s / 4) * Rows;
#define MOED_DOT(p, r)                                                                   \
  if constexpr ((r) < Rows) {                                                            \
    acc##p##r = _mm512_dpbusd_epi32(acc##p##r, w0, _mm512_set1_epi32(int(x[(r)])));      \
    acc##p##r = _mm512_dpbusd_epi32(acc##p##r, w1, _mm512_set1_epi32(int(x[Rows + (r)]))); \
  }
#define MOED_PANEL(p)                                                                              \
  {                                                                                                \
    _mm_prefetch(reinterpret_cast<const char*>(g.panels[(p)] + 8 * s + kFusedPrefetchBytes), _MM_HINT_T1); \
    const __m512i c = _mm512_loadu_si512(g.panels[(p)] + 8 * s);                                   \
    const __m512i lo = _mm512_shuffle_epi8(lookup, _mm512_and_si512(c, low));                      \
    const __m512i hi = _mm512_shuffle_epi8(lookup, _mm512_and_si512(_mm512_srli_epi16(c, 4), low)); \
    const __m512i w0 = _mm512_permutex2var_epi8(lo, quad0, hi), w1 = _mm512_permutex2var_epi8(lo, quad1, hi); \
    MOED_ROW_CELLS(MOED_DOT, p)                                                                    \
  }
        MOED_PANEL(0) MOED_PANEL(1) MOED_PANEL(2) MOED_PANEL(3)
#undef MOED_PANEL
#undef MOED_DOT
      }
      const bool from_zero = g.first && b == 0;
      const __m512 scale0 = half_scales(g.exps[0] + 16 * b), scale1 = half_scales(g.exps[1] + 16 * b),
                   scale2 = half_scales(g.exps[2] + 16 * b), scale3 = half_scales(g.exps[3] + 16 * b);
      MOED_CELLS(MOED_SCALE)
    }
  }
};
#undef MOED_CELLS
#undef MOED_ROW_CELLS
#undef MOED_SCALE

void fp4_fused_any(const Fp4TileArgs& g) { run_rows<Fp4Fused, 3>(g.rows, g); }

// The portable quantize_row 16 floats at a time: max |x| is exact in any
// order, and the multiply and the round to even (the default rounding of
// vcvtps2dq) are the scalar ones.
float quantize(const float* x, std::size_t k, std::int8_t* q, std::int32_t* sum) {
  const __m512i magnitude = _mm512_set1_epi32(0x7fffffff);
  const __m512 infinity = _mm512_set1_ps(__builtin_huge_valf());
  __m512 amax = _mm512_setzero_ps();
  std::size_t j = 0;
  const auto tail = [&](std::size_t at) { return __mmask16(at + 16 <= k ? 0xffff : (1u << (k - at)) - 1); };
  for (; j < k; j += 16) {
    const __m512 v = _mm512_castsi512_ps(
        _mm512_and_si512(_mm512_castps_si512(_mm512_maskz_loadu_ps(tail(j), x + j)), magnitude));
    if (_mm512_cmp_ps_mask(v, infinity, _CMP_NLT_UQ)) return __builtin_nanf("");  // inf or NaN
    amax = _mm512_max_ps(amax, v);
  }
  const float top = _mm512_reduce_max_ps(amax);
  const __m512 inv = _mm512_set1_ps(top > 0 ? 127.0f / top : 0.0f);
  __m512i total = _mm512_setzero_si512();
  for (j = 0; j < k; j += 16) {
    const __m512i codes = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_maskz_loadu_ps(tail(j), x + j), inv));
    total = _mm512_add_epi32(total, codes);
    _mm512_mask_cvtepi32_storeu_epi8(q + j, tail(j), codes);
  }
  *sum = _mm512_reduce_add_epi32(total);
  return top / 127.0f;
}

void finish(const Int8FinishArgs& g) {
  for (std::size_t r = 0; r < g.rows; ++r) {
    const __m512i offset = _mm512_set1_epi32(128 * g.row_sum[r]);
    const __m512 row_scale = _mm512_set1_ps(g.row_scale[r]);
    const std::int32_t* sums = g.sums + r * g.ld;
    float* c = g.c + r * g.ldc;
    for (std::size_t j = 0; j < g.cols; j += 16) {
      const __mmask16 valid = j + 16 <= g.cols ? __mmask16(0xffff) : __mmask16((1u << (g.cols - j)) - 1);
      const __m512i exact = _mm512_sub_epi32(_mm512_maskz_loadu_epi32(valid, sums + j), offset);
      const __m512 scaled = _mm512_mul_ps(_mm512_cvtepi32_ps(exact), row_scale);
      _mm512_mask_storeu_ps(c + j, valid, _mm512_mul_ps(scaled, _mm512_maskz_loadu_ps(valid, g.col_scale + j)));
    }
  }
}

}  // namespace

Int8Kernels avx512_vnni_int8_kernels() {
  return {tile_any, prepare, 6, prepare_fp4, fp4_tile_any, fp4_fused_any, quantize, finish};
}

}  // namespace moed::kernels::detail
