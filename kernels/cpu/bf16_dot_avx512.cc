// The bf16 dot-product kernels (bf16_dot_tile.h) for AVX-512 BF16: the
// panel decoder (pair_codes_avx512.h's decoders into a buffer), and tiles of
// up to 12 rows x 16 or 32 columns built on vdpbf16ps. Compiled with
// -mavx512bf16 and VBMI, called only where the CPU has both; includes
// nothing but the intrinsics, bf16_dot_tile.h and the decoders.
#include <immintrin.h>

#include <type_traits>

#include "kernels/cpu/bf16_dot_tile.h"
#include "kernels/cpu/pair_codes_avx512.h"

namespace moed::kernels::detail {
namespace {

using pair_codes::Bf16Codes;
using pair_codes::ByteCodes;
using pair_codes::Fp4Codes;


template <class Codes>
void decode_with(const QuantPanel& w, std::size_t k0, std::size_t kc, std::uint16_t* out) {
  static const Codes codes;
  const std::uint8_t* src = w.codes + k0 * Codes::kStepBytes;
  for (std::size_t s = 0; s < kc; s += 4) {
    _mm_prefetch(reinterpret_cast<const char*>(src + s * Codes::kStepBytes + kPrefetchBytes), _MM_HINT_T0);
    __m512i p0, p1;
    codes.two(src, s, kc - s, p0, p1);
    _mm512_store_si512(out + 16 * s, p0);
    if (kc - s > 2) _mm512_store_si512(out + 16 * s + 32, p1);
  }
}

void decode_any(const QuantPanel& w, std::size_t k0, std::size_t kc, std::uint16_t* out) {
  switch (w.kind) {
    case QuantPanel::bf16:
      return decode_with<Bf16Codes>(w, k0, kc, out);
    case QuantPanel::fp8:
      return decode_with<ByteCodes<false>>(w, k0, kc, out);
    case QuantPanel::int8:
      return decode_with<ByteCodes<true>>(w, k0, kc, out);
    case QuantPanel::mxfp4:
      return decode_with<Fp4Codes>(w, k0, kc, out);
  }
}

inline __m512 dot(__m512 acc, std::uint32_t x, __m512i w) {
  return _mm512_dpbf16_ps(acc, (__m512bh)_mm512_set1_epi32(int(x)), (__m512bh)w);
}

// Accumulators are named variables, as in fixed_order_gemm_avx512.cc.
#define MOED_ROWS(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7) X(8) X(9) X(10) X(11)

template <int Rows>
struct Tile {
  static void run(const DotTileArgs& g, const std::uint16_t* w) {
#define MOED_DECLARE(r) __m512 acc##r = _mm512_setzero_ps();
    MOED_ROWS(MOED_DECLARE)
#undef MOED_DECLARE
    const auto chain = [&](std::size_t t0, std::size_t t1) __attribute__((always_inline)) {
      for (std::size_t t = t0; t < t1; ++t) {
        const __m512i wv = _mm512_load_si512(w + 32 * t);
        const std::uint32_t* x = g.a + t * Rows;
#define MOED_STEP(r) \
  if constexpr ((r) < Rows) acc##r = dot(acc##r, x[(r)], wv);
        MOED_ROWS(MOED_STEP)
#undef MOED_STEP
      }
    };
    if (g.block_pairs == 0) {
      if (!g.first) {
#define MOED_LOAD(r) \
  if constexpr ((r) < Rows) acc##r = _mm512_loadu_ps(g.c + (r) * g.ldc);
        MOED_ROWS(MOED_LOAD)
#undef MOED_LOAD
      }
      chain(0, g.npairs);
#define MOED_STORE(r) \
  if constexpr ((r) < Rows) _mm512_storeu_ps(g.c + (r) * g.ldc, acc##r);
      MOED_ROWS(MOED_STORE)
#undef MOED_STORE
      return;
    }
    for (std::size_t t0 = 0, b = 0; t0 < g.npairs; t0 += g.block_pairs, ++b) {
#define MOED_ZERO(r) acc##r = _mm512_setzero_ps();
      MOED_ROWS(MOED_ZERO)
#undef MOED_ZERO
      chain(t0, t0 + g.block_pairs < g.npairs ? t0 + g.block_pairs : g.npairs);
      const __m512 s = _mm512_loadu_ps(g.scales + 16 * b);
      const bool from_zero = g.first && b == 0;
#define MOED_SCALE(r)                                                                          \
  if constexpr ((r) < Rows) {                                                                    \
    const __m512 total = from_zero ? _mm512_setzero_ps() : _mm512_loadu_ps(g.c + (r) * g.ldc); \
    _mm512_storeu_ps(g.c + (r) * g.ldc, _mm512_fmadd_ps(acc##r, s, total));                     \
  }
      MOED_ROWS(MOED_SCALE)
#undef MOED_SCALE
    }
  }
};

// Two panels side by side: each broadcast feeds two dot products.
template <int Rows>
struct TilePair {
  static constexpr int kTotalsInRegisters = 6;
  static void run(const DotTileArgs& g, const std::uint16_t* w0, const std::uint16_t* w1, const float* scales1) {
#define MOED_DECLARE(r) __m512 lo##r = _mm512_setzero_ps(), hi##r = _mm512_setzero_ps();
    MOED_ROWS(MOED_DECLARE)
#undef MOED_DECLARE
    const auto chain = [&](std::size_t t0, std::size_t t1) __attribute__((always_inline)) {
      for (std::size_t t = t0; t < t1; ++t) {
        const __m512i v0 = _mm512_load_si512(w0 + 32 * t), v1 = _mm512_load_si512(w1 + 32 * t);
        const std::uint32_t* x = g.a + t * Rows;
#define MOED_STEP(r)                                                  \
  if constexpr ((r) < Rows) {                                           \
    const __m512bh x##r = (__m512bh)_mm512_set1_epi32(int(x[(r)]));     \
    lo##r = _mm512_dpbf16_ps(lo##r, x##r, (__m512bh)v0);              \
    hi##r = _mm512_dpbf16_ps(hi##r, x##r, (__m512bh)v1);              \
  }
        MOED_ROWS(MOED_STEP)
#undef MOED_STEP
      }
    };
    const auto store_row = [&](std::size_t r, __m512 lo, __m512 hi) __attribute__((always_inline)) {
      _mm512_storeu_ps(g.c + r * g.ldc, lo);
      _mm512_storeu_ps(g.c + r * g.ldc + 16, hi);
    };
    if (g.block_pairs == 0) {
      if (!g.first) {
#define MOED_LOAD(r)                                \
  if constexpr ((r) < Rows) {                         \
    lo##r = _mm512_loadu_ps(g.c + (r) * g.ldc);       \
    hi##r = _mm512_loadu_ps(g.c + (r) * g.ldc + 16);  \
  }
        MOED_ROWS(MOED_LOAD)
#undef MOED_LOAD
      }
      chain(0, g.npairs);
#define MOED_STORE(r) \
  if constexpr ((r) < Rows) store_row((r), lo##r, hi##r);
      MOED_ROWS(MOED_STORE)
#undef MOED_STORE
      return;
    }
    // Scale blocks. Up to 6 rows the totals stay in registers from block to
    // block (12 chains, 12 totals): a block then costs an fma per chain, not
    // also a load and a store of C. The same fmas in the same order.
    constexpr bool kInRegisters = Rows <= kTotalsInRegisters;
#define MOED_TOTALS(r)                                                                \
  __m512 total_lo##r = _mm512_setzero_ps(), total_hi##r = _mm512_setzero_ps();        \
  if constexpr (kInRegisters && (r) < Rows)                                           \
    if (!g.first) {                                                                   \
      total_lo##r = _mm512_loadu_ps(g.c + (r) * g.ldc);                               \
      total_hi##r = _mm512_loadu_ps(g.c + (r) * g.ldc + 16);                          \
    }
    MOED_ROWS(MOED_TOTALS)
#undef MOED_TOTALS
    for (std::size_t t0 = 0, b = 0; t0 < g.npairs; t0 += g.block_pairs, ++b) {
#define MOED_ZERO(r) lo##r = hi##r = _mm512_setzero_ps();
      MOED_ROWS(MOED_ZERO)
#undef MOED_ZERO
      chain(t0, t0 + g.block_pairs < g.npairs ? t0 + g.block_pairs : g.npairs);
      const __m512 s0 = _mm512_loadu_ps(g.scales + 16 * b), s1 = _mm512_loadu_ps(scales1 + 16 * b);
      const bool from_zero = g.first && b == 0;
#define MOED_SCALE(r)                                                                                     \
  if constexpr ((r) < Rows) {                                                                             \
    if constexpr (!kInRegisters) {                                                                        \
      total_lo##r = from_zero ? _mm512_setzero_ps() : _mm512_loadu_ps(g.c + (r) * g.ldc);                 \
      total_hi##r = from_zero ? _mm512_setzero_ps() : _mm512_loadu_ps(g.c + (r) * g.ldc + 16);            \
    }                                                                                                     \
    total_lo##r = _mm512_fmadd_ps(lo##r, s0, total_lo##r);                                                \
    total_hi##r = _mm512_fmadd_ps(hi##r, s1, total_hi##r);                                                \
    if constexpr (!kInRegisters) store_row((r), total_lo##r, total_hi##r);                                \
  }
      MOED_ROWS(MOED_SCALE)
#undef MOED_SCALE
    }
    if constexpr (kInRegisters) {
#define MOED_STORE(r) \
  if constexpr ((r) < Rows) store_row((r), total_lo##r, total_hi##r);
      MOED_ROWS(MOED_STORE)
#undef MOED_STORE
    }
  }
};
#undef MOED_ROWS

// Scale block b of a fused tile's range (from step k0): mxfp4's 16 e8m0
// bytes widened here, as e8m0_values does (2^(e - 127); 0: 2^-127; 255:
// NaN), for a pass over them beside the tile cost as much as a third of the
// tile's time at one row; fp8's from the caller's floats.
template <class Codes>
__m512 block_scale(const QuantPanel& w, const float* scales, std::size_t k0, std::size_t b) {
  if constexpr (std::is_same_v<Codes, Fp4Codes>) {
    const std::uint8_t* codes = w.scales + 16 * (k0 / 32 + b);
    const __m512i e = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(codes)));
    const __mmask16 edge = _mm512_cmpeq_epi32_mask(e, _mm512_setzero_si512()) |
                           _mm512_cmpeq_epi32_mask(e, _mm512_set1_epi32(255));
    const __m512i bits = _mm512_slli_epi32(e, 23);
    return _mm512_castsi512_ps(_mm512_mask_or_epi32(bits, edge, bits, _mm512_set1_epi32(0x00400000)));
  } else {
    return _mm512_loadu_ps(scales + 16 * b);
  }
}

// Panels x Rows cells (at most 4 x 12, 12 used), pairs decoded in
// registers (DotFusedTile).
#define MOED_ROW_CELLS(X, p) X(p, 0) X(p, 1) X(p, 2) X(p, 3) X(p, 4) X(p, 5) X(p, 6) X(p, 7) X(p, 8) X(p, 9) X(p, 10) X(p, 11)
#define MOED_CELLS(X) MOED_ROW_CELLS(X, 0) MOED_ROW_CELLS(X, 1) MOED_ROW_CELLS(X, 2) MOED_ROW_CELLS(X, 3)
// The fused tiles prefetch into L2 (T1), 2 KB ahead, not into L1 1 KB
// ahead as the other tiles do (kPrefetchBytes): on Zen 4 at one row from
// DRAM, side by side, bf16 went from 21-22 to 27 GB/s and fp8 from 25 to
// 27-28; 4 KB gave the same, 2 KB into L1 less than 1 KB. The L1 holds too
// few misses in flight for four streams this far ahead.
constexpr std::size_t kFusedPrefetchBytes = 2048;

template <int Panels, int Rows, class Codes>
struct Fused {
  static_assert(Panels * Rows <= 12, "12 accumulators, the tables and the decoded pairs fill the 32 registers");
  static void run(const DotTileArgs& g, const QuantPanel* w, std::size_t k0, std::size_t kc,
                  const float* const* scales) {
    static const Codes codes_static;
    const Codes codes = codes_static;  // its tables in registers
    const std::uint8_t* src[Panels];
    for (int p = 0; p < Panels; ++p) src[p] = w[p].codes + k0 * Codes::kStepBytes;
    // Prefetching past a stream's end reaches the same stream of the next
    // group of panels (the caller's next call, panels being contiguous; a
    // lone panel's stream runs on into the next panel by itself): at short
    // k (1,024 steps: 16 KB of fp8) each group's first lines would
    // otherwise come from DRAM unannounced.
    // (Addresses only: a prefetch reads nothing and never faults.)
    const std::ptrdiff_t stream_bytes = std::ptrdiff_t(kc * Codes::kStepBytes);
    const std::ptrdiff_t to_next_group = Panels > 1 ? Panels * (w[1].codes - w[0].codes) - stream_bytes : 0;
    const auto prefetch = [&](int p, const std::uint8_t* at) __attribute__((always_inline)) {
      std::ptrdiff_t ahead = (at - src[p]) + std::ptrdiff_t(kFusedPrefetchBytes);
      if (ahead >= stream_bytes) ahead += to_next_group;
      _mm_prefetch(reinterpret_cast<const char*>(src[p]) + ahead, _MM_HINT_T1);
    };
#define MOED_DECLARE(p, r) __m512 acc##p##r = _mm512_setzero_ps();
    MOED_CELLS(MOED_DECLARE)
#undef MOED_DECLARE
    // Pairs t and t + 1 (t even; the second only where both). Each panel's
    // two pairs are decoded just before their products, so that few decoded
    // vectors are live at once. Whole (4 steps, both pairs): no mask and no
    // branch between the panels, so each row's broadcast serves them all.
    const auto pairs = [&](std::size_t t, bool both, auto whole) __attribute__((always_inline)) {
      const std::size_t steps = decltype(whole)::value ? 4 : kc - 2 * t;
      if constexpr (decltype(whole)::value) both = true;
      const std::uint32_t* x = g.a + t * Rows;
#define MOED_DOT0(p, r) \
  if constexpr ((r) < Rows) acc##p##r = dot(acc##p##r, x[(r)], v0);
#define MOED_DOT1(p, r) \
  if constexpr ((r) < Rows) acc##p##r = dot(acc##p##r, x[Rows + (r)], v1);
#define MOED_PANEL(p)                                                    \
  if constexpr ((p) < Panels) {                                            \
    const std::uint8_t* at = src[(p)] + 2 * t * Codes::kStepBytes;        \
    prefetch((p), at);                                                    \
    __m512i v0, v1;                                                      \
    codes.two(src[(p)], 2 * t, steps, v0, v1);                           \
    MOED_ROW_CELLS(MOED_DOT0, p)                                         \
    if (both) {                                                          \
      MOED_ROW_CELLS(MOED_DOT1, p)                                       \
    }                                                                    \
  }
        MOED_PANEL(0) MOED_PANEL(1) MOED_PANEL(2) MOED_PANEL(3)
#undef MOED_PANEL
#undef MOED_DOT1
#undef MOED_DOT0
    };
    // mxfp4: pairs t..t + 3, a whole group of codes (t a multiple of 4):
    // one load, and three shifts for four lookups, where pairs() takes two
    // loads and four shifts (1.3x a call's speed from L3 on Zen 4, 1.1x
    // from DRAM at DeepSeek's W1|W3).
    const auto group = [&](std::size_t t) __attribute__((always_inline)) {
      if constexpr (std::is_same_v<Codes, Fp4Codes>) {
        const std::uint32_t* x = g.a + t * Rows;
#define MOED_DOTS(p, r)                                          \
  if constexpr ((r) < Rows) {                                    \
    acc##p##r = dot(acc##p##r, x[(r)], v0);                      \
    acc##p##r = dot(acc##p##r, x[Rows + (r)], v1);               \
    acc##p##r = dot(acc##p##r, x[2 * Rows + (r)], v2);           \
    acc##p##r = dot(acc##p##r, x[3 * Rows + (r)], v3);           \
  }
#define MOED_PANEL(p)                                            \
  if constexpr ((p) < Panels) {                                  \
    prefetch((p), src[(p)] + 2 * t * Codes::kStepBytes);         \
    __m512i v0, v1, v2, v3;                                      \
    codes.group(src[(p)], 2 * t, v0, v1, v2, v3);                \
    MOED_ROW_CELLS(MOED_DOTS, p)                                 \
  }
        MOED_PANEL(0) MOED_PANEL(1) MOED_PANEL(2) MOED_PANEL(3)
#undef MOED_PANEL
#undef MOED_DOTS
      }
    };
    // Pairs [t0, t1), t0 even: two at a time, then the last one alone.
    const auto chain = [&](std::size_t t0, std::size_t t1) __attribute__((always_inline)) {
      std::size_t t = t0;
      if constexpr (std::is_same_v<Codes, Fp4Codes>)
        if (t % 4 == 0)
          for (; t + 4 <= t1 && 2 * t + 8 <= kc; t += 4) group(t);
      for (; t + 2 <= t1 && 2 * t + 4 <= kc; t += 2) pairs(t, true, std::true_type{});
      for (; t < t1; t += 2) pairs(t, t + 1 < t1, std::false_type{});
    };
    if (g.block_pairs == 0) {
      if (!g.first) {
#define MOED_LOAD(p, r) \
  if constexpr ((p) < Panels && (r) < Rows) acc##p##r = _mm512_loadu_ps(g.c + (r) * g.ldc + 16 * (p));
        MOED_CELLS(MOED_LOAD)
#undef MOED_LOAD
      }
      chain(0, g.npairs);
#define MOED_STORE(p, r) \
  if constexpr ((p) < Panels && (r) < Rows) _mm512_storeu_ps(g.c + (r) * g.ldc + 16 * (p), acc##p##r);
      MOED_CELLS(MOED_STORE)
#undef MOED_STORE
      return;
    }
    for (std::size_t t0 = 0, b = 0; t0 < g.npairs; t0 += g.block_pairs, ++b) {
#define MOED_ZERO(p, r) acc##p##r = _mm512_setzero_ps();
      MOED_CELLS(MOED_ZERO)
#undef MOED_ZERO
      chain(t0, t0 + g.block_pairs < g.npairs ? t0 + g.block_pairs : g.npairs);
      const bool from_zero = g.first && b == 0;
#define MOED_SCALE(p, r)                                                                                    \
  if constexpr ((p) < Panels && (r) < Rows) {                                                                   \
    float* at = g.c + (r) * g.ldc + 16 * (p);                                                                   \
    const __m512 total = from_zero ? _mm512_setzero_ps() : _mm512_loadu_ps(at);                            \
    _mm512_storeu_ps(at, _mm512_fmadd_ps(acc##p##r, scale[(p)], total));                                     \
  }
      __m512 scale[Panels];
      for (int p = 0; p < Panels; ++p) scale[p] = block_scale<Codes>(w[p], scales[p], k0, b);
      MOED_CELLS(MOED_SCALE)
#undef MOED_SCALE
    }
  }
};
#undef MOED_CELLS
#undef MOED_ROW_CELLS

template <int Rows, class Codes>
struct FusedRows {
  static void run(const DotTileArgs& g, const QuantPanel* w, std::size_t k0, std::size_t kc,
                  const float* const* scales) {
    Fused<int(dot_fused_panels(Rows)), Rows, Codes>::run(g, w, k0, kc, scales);
  }
};

void fused_any(const DotTileArgs& g, const QuantPanel* w, std::size_t k0, std::size_t kc,
               const float* const* scales) {
  pair_codes::run_decoding<FusedRows, 12, 12, 12, 12>(w[0].kind, g.rows, g, w, k0, kc, scales);
}

void tile_any(const DotTileArgs& g, const std::uint16_t* w) { run_rows<Tile, 12>(g.rows, g, w); }
void pair_any(const DotTileArgs& g, const std::uint16_t* w0, const std::uint16_t* w1, const float* scales1) {
  run_rows<TilePair, 12>(g.rows, g, w0, w1, scales1);
}

}  // namespace

DotKernels avx512_bf16_dot_kernels() { return {decode_any, tile_any, 12, pair_any, fused_any}; }

}  // namespace moed::kernels::detail
