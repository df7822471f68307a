// The amx products' decode tiles (amx_tile.h's AmxFusedTile): the bits of
// AMX's TDPBF16PS computed with AVX-512 fmas, for the few rows at which a
// tile product, whose cost does not shrink with its rows, would leave the
// core idle; and, where the CPU has AMX, some of those rows on the tiles
// themselves, decoding in registers (on_tiles, the one function here built
// for AMX). Built with the flags of bf16_dot_avx512.cc (its
// decoders); called only where the CPU has them.
#include <immintrin.h>

#include <array>
#include <type_traits>

#include "kernels/cpu/amx_tile.h"
#include "kernels/cpu/fixed_order_tile.h"  // kPrefetchBytes
#include "kernels/cpu/pair_codes_avx512.h"

namespace moed::kernels::detail {
namespace {

using pair_codes::Fp4Codes;

constexpr std::size_t kBlock = kAmxBlock;  // 32 steps: one tile product
constexpr unsigned kDazFtz = 0x8040;       // MXCSR's FTZ (bit 15) and DAZ (bit 6)

// The pairs' even steps (the low halves) and odd steps as fp32.
inline __m512 even_steps(__m512i pairs) { return _mm512_castsi512_ps(_mm512_slli_epi32(pairs, 16)); }
inline __m512 odd_steps(__m512i pairs) {
  return _mm512_castsi512_ps(_mm512_and_si512(pairs, _mm512_set1_epi32(int(0xffff0000u))));
}

// Each panel's stream of codes from the range's first step, and a prefetch
// 1 KB ahead in it (as the bf16 products' fused tiles), past a stream's end
// into the same stream of the next group of panels.
template <int Panels, class Codes>
struct PanelStreams {
  const std::uint8_t* src[Panels];
  std::ptrdiff_t stream_bytes, to_next_group;
  explicit PanelStreams(const AmxFusedArgs& g)
      : stream_bytes(std::ptrdiff_t(g.kc * Codes::kStepBytes)),
        to_next_group(Panels > 1 ? Panels * (g.w[1].codes - g.w[0].codes) - stream_bytes : 0) {
    for (int p = 0; p < Panels; ++p) src[p] = g.w[p].codes + g.k0 * Codes::kStepBytes;
  }
  __attribute__((always_inline)) void prefetch(int p, const std::uint8_t* at) const {
    std::ptrdiff_t ahead = (at - src[p]) + std::ptrdiff_t(kPrefetchBytes);
    if (ahead >= stream_bytes) ahead += to_next_group;
    _mm_prefetch(reinterpret_cast<const char*>(src[p]) + ahead, _MM_HINT_T0);
  }
};

// Up to 4 panels x 8 rows, at most 8 cells: an E and an O chain each.
#define MOED_ROW_CELLS(X, p) X(p, 0) X(p, 1) X(p, 2) X(p, 3) X(p, 4) X(p, 5) X(p, 6) X(p, 7)
#define MOED_CELLS(X) MOED_ROW_CELLS(X, 0) MOED_ROW_CELLS(X, 1) MOED_ROW_CELLS(X, 2) MOED_ROW_CELLS(X, 3)
template <int Panels, int Rows, class Codes>
struct Fused {
  static_assert(Panels * Rows <= 8, "two chains a cell, the tables and the decoded pairs fill the 32 registers");
  static constexpr bool kFp4 = std::is_same_v<Codes, Fp4Codes>;  // block scales on the weights or the chains

  static void run(const AmxFusedArgs& g) {
    static const Codes codes_static;
    const Codes codes = codes_static;  // its tables in registers
    const PanelStreams<Panels, Codes> streams(g);
    const auto& src = streams.src;
    // C (or fp8's S) between blocks: a block's T is added once per 32 steps.
    alignas(64) float sums[Rows][Panels * 16];
    const std::size_t blocks = (g.kc + kBlock - 1) / kBlock;
    const unsigned caller_csr = _mm_getcsr();
    _mm_setcsr(caller_csr | kDazFtz);
#define MOED_DECLARE(p, r) __m512 even##p##r, odd##p##r;
    MOED_CELLS(MOED_DECLARE)
#undef MOED_DECLARE
    for (std::size_t b = 0; b < blocks; ++b) {
#define MOED_ZERO(p, r) \
  if constexpr ((p) < Panels && (r) < Rows) even##p##r = odd##p##r = _mm512_setzero_ps();
      MOED_CELLS(MOED_ZERO)
#undef MOED_ZERO
      // mxfp4: the block's 16 scales as exponents for vscalefps (e - 127:
      // code x 2^(e - 127) exact, a result below fp32's normal range 0 by
      // FTZ), applied to each weight; or, where every scale of the block lies
      // in [chain_scales_from, chain_scales_to] (amx_tile.h), to the two
      // chains at the block's end, with the same bits and a vscalefps for
      // every 512 weights instead of every 16.
      __m512 exponent[Panels];
      bool on_chains = true;
      if constexpr (kFp4) {
        const std::size_t block = g.k0 / kBlock + b;
        const __m128i from = _mm_set1_epi8(char(g.chain_scales_from)), to = _mm_set1_epi8(char(g.chain_scales_to));
        for (int p = 0; p < Panels; ++p) {
          const __m128i e = _mm_loadu_si128(reinterpret_cast<const __m128i*>(g.w[p].scales + 16 * block));
          exponent[p] = _mm512_cvtepi32_ps(_mm512_sub_epi32(_mm512_cvtepu8_epi32(e), _mm512_set1_epi32(127)));
          on_chains = on_chains && (_mm_cmpge_epu8_mask(e, from) & _mm_cmple_epu8_mask(e, to)) == 0xffff;
        }
      }
      const auto block_steps = [&]<bool ScaleWeights>() __attribute__((always_inline)) {
        for (std::size_t s = kBlock * b; s < kBlock * (b + 1); s += 4) {
          const std::size_t steps = s < g.kc ? g.kc - s : 0;  // 0 past the range: zeros
#define MOED_FMA(p, r)                                                                              \
  if constexpr ((r) < Rows) {                                                                       \
    const float* x = g.x + (r) * g.x_stride + s;                                                    \
    even##p##r = _mm512_fmadd_ps(_mm512_set1_ps(x[0]), w0e, even##p##r);                           \
    odd##p##r = _mm512_fmadd_ps(_mm512_set1_ps(x[1]), w0o, odd##p##r);                             \
    even##p##r = _mm512_fmadd_ps(_mm512_set1_ps(x[2]), w1e, even##p##r);                           \
    odd##p##r = _mm512_fmadd_ps(_mm512_set1_ps(x[3]), w1o, odd##p##r);                             \
  }
#define MOED_PANEL(p)                                                                               \
  if constexpr ((p) < Panels) {                                                                     \
    const std::uint8_t* at = src[(p)] + s * Codes::kStepBytes;                                      \
    streams.prefetch((p), at);                                                                              \
    __m512i v0, v1;                                                                                 \
    codes.two(src[(p)], s, steps, v0, v1);                                                          \
    __m512 w0e = even_steps(v0), w0o = odd_steps(v0), w1e = even_steps(v1), w1o = odd_steps(v1);    \
    if constexpr (ScaleWeights) {                                                                   \
      w0e = _mm512_scalef_ps(w0e, exponent[(p)]);                                                   \
      w0o = _mm512_scalef_ps(w0o, exponent[(p)]);                                                   \
      w1e = _mm512_scalef_ps(w1e, exponent[(p)]);                                                   \
      w1o = _mm512_scalef_ps(w1o, exponent[(p)]);                                                   \
    }                                                                                               \
    MOED_ROW_CELLS(MOED_FMA, p)                                                                     \
  }
          MOED_PANEL(0) MOED_PANEL(1) MOED_PANEL(2) MOED_PANEL(3)
#undef MOED_PANEL
#undef MOED_FMA
        }
      };
      if (!kFp4 || on_chains) {
        block_steps.template operator()<false>();
      } else {
        block_steps.template operator()<true>();
      }
      if constexpr (kFp4) {
        if (on_chains) {
#define MOED_SCALE_CHAINS(p, r)                                  \
  if constexpr ((p) < Panels && (r) < Rows) {                    \
    even##p##r = _mm512_scalef_ps(even##p##r, exponent[(p)]);    \
    odd##p##r = _mm512_scalef_ps(odd##p##r, exponent[(p)]);      \
  }
          MOED_CELLS(MOED_SCALE_CHAINS)
#undef MOED_SCALE_CHAINS
        }
      }
      // T = E + O; C = C + T, or S = S + T over an fp8 scale block, from +0
      // (0 + T, not T: the sum maps T = -0 to +0, as the tiles do).
      const bool group_start = g.group == 0 ? b == 0 : b % g.group == 0;
#define MOED_SUM(p, r)                                                                \
  if constexpr ((p) < Panels && (r) < Rows) {                                         \
    float* at = sums[(r)] + 16 * (p);                                                 \
    const __m512 before = group_start ? _mm512_setzero_ps() : _mm512_load_ps(at);     \
    _mm512_store_ps(at, _mm512_add_ps(before, _mm512_add_ps(even##p##r, odd##p##r))); \
  }
      MOED_CELLS(MOED_SUM)
#undef MOED_SUM
      const bool group_end = g.group != 0 && ((b + 1) % g.group == 0 || b + 1 == blocks);
      if (group_end) {  // C = fma(S, scale, C), an ordinary fma
        _mm_setcsr(caller_csr);
        const std::size_t scale_block = b / g.group;
        for (int r = 0; r < Rows; ++r)
          for (int p = 0; p < Panels; ++p) {
            float* c = g.c + r * g.ldc + 16 * p;
            const __m512 before = scale_block == 0 ? _mm512_setzero_ps() : _mm512_loadu_ps(c);
            const __m512 scale = _mm512_loadu_ps(g.scales[p] + 16 * scale_block);
            _mm512_storeu_ps(c, _mm512_fmadd_ps(_mm512_load_ps(sums[r] + 16 * p), scale, before));
          }
        _mm_setcsr(caller_csr | kDazFtz);
      }
    }
    _mm_setcsr(caller_csr);
    if (g.group == 0)
      for (int r = 0; r < Rows; ++r)
        for (int p = 0; p < Panels; ++p) _mm512_storeu_ps(g.c + r * g.ldc + 16 * p, _mm512_load_ps(sums[r] + 16 * p));
  }
};
#undef MOED_CELLS
#undef MOED_ROW_CELLS

// ---- mxfp4 on the tiles themselves, where the CPU has them ----------------
//
// The decode tiles above spend an fma on every weight and row; at one row
// mxfp4, whose weights come twice as fast as fp8's per byte, is bound by
// them (about 15 G weights/s on a core of the Xeon with AMX of
// docs/benchmarks.md, 0.56-0.60 of the bandwidth bound). Here each block's 16 pairs of a panel are decoded in
// registers, already scaled, to an L1 buffer, and the tiles take them as the
// tiles' own GEMM does (amx_tiles.cc): so these are the tiles' bits, by
// construction. The scaling is one saturating subtract: the lookup gives
// each magnitude's bf16 code 2^125 times too large (every one still finite),
// and 2^(e - 127) is then (252 - e) << 7 off its exponent field, exact for
// every code where 2 <= e <= 252 (every scaled value normal). A zero code
// stays 0 in the saturation: -0 becomes +0, which changes no sum (every
// chain starts from +0, and +0 + -0 is +0). Ranges with a scale outside
// [2, 252], or not of whole blocks, take the decode tiles.
//
// The other formats take the same road from kTilesFromRows rows, their
// pairs unscaled: bf16 and int8 with C over every block, fp8 with S over
// each scale block from +0, stored, and C = fma(S, scale, C) in AVX-512 a
// scale block later, as the tiles' GEMM does.

struct TileConfig {  // ldtilecfg's 64 bytes
  std::uint8_t palette = 1;
  std::uint8_t start_row = 0;
  std::uint8_t reserved[14] = {};
  std::uint16_t colsb[16] = {};
  std::uint8_t rows[16] = {};
};
// tmm0: the block's rows (AmxPack's layout, `rows` x 64 bytes); tmm1-3: a
// panel's pairs, in turn (16 x 64 bytes); tmm4-7: panel p's sums C.
constexpr TileConfig stream_config(int rows) {
  TileConfig config;
  for (int t = 0; t < 8; ++t) {
    config.colsb[t] = 64;
    config.rows[t] = std::uint8_t(t >= 1 && t <= 3 ? 16 : rows);
  }
  return config;
}
struct StreamConfigs {
  TileConfig by_rows[kAmxFusedRows];
  constexpr StreamConfigs() {
    for (int r = 0; r < int(kAmxFusedRows); ++r) by_rows[r] = stream_config(r + 1);
  }
};
// In memory, not built on the stack (GCC 12 drops a local configuration's
// stores: amx_tiles.cc).
alignas(64) const StreamConfigs kStreamConfigs;

constexpr int kFp4TileBias = 125;  // the lookup's codes are 2^125 times the values
constexpr std::uint8_t kFp4TileScaleFrom = 2, kFp4TileScaleTo = 252;

// Whether every scale of the range's blocks, in every panel, lies in [2, 252].
template <int Panels>
bool scales_fit_tiles(const AmxFusedArgs& g) {
  const __m128i from = _mm_set1_epi8(char(kFp4TileScaleFrom)), to = _mm_set1_epi8(char(kFp4TileScaleTo));
  for (int p = 0; p < Panels; ++p)
    for (std::size_t b = g.k0 / kBlock; b < (g.k0 + g.kc) / kBlock; ++b) {
      const __m128i e = _mm_loadu_si128(reinterpret_cast<const __m128i*>(g.w[p].scales + 16 * b));
      if ((_mm_cmpge_epu8_mask(e, from) & _mm_cmple_epu8_mask(e, to)) != 0xffff) return false;
    }
  return true;
}

// The tile intrinsics take a tile's number as a literal token.
#define MOED_PANEL_PRODUCT(pairs_tile, c_tile, pairs) \
  _tile_loadd(pairs_tile, pairs, 64);                 \
  _tile_dpbf16ps(c_tile, 0, pairs_tile);

// GCC 12 warns of its own intrinsics' _mm512_undefined_epi32() inside a
// function of another target (a known false positive).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
template <int Panels, class Codes>
__attribute__((target("amx-tile,amx-bf16"))) void on_tiles(const AmxFusedArgs& g) {
  constexpr bool kFp4 = std::is_same_v<Codes, Fp4Codes>;
  // mxfp4's lookup: each code's bf16 word 2^125 too large, zeros 0.
  static const std::array<std::uint16_t, 32> fp4_words = [] {
    std::array<std::uint16_t, 32> v{};
    for (int e = 0; e < 32; ++e) {
      const int nibble = e % 16, magnitude = nibble & 7;
      v[e] = magnitude == 0 ? 0
                            : std::uint16_t((pair_codes::kFp4Bf16[magnitude] + (kFp4TileBias << 7)) |
                                            (nibble & 8 ? 0x8000 : 0));
    }
    return v;
  }();
  const __m512i table = _mm512_loadu_si512(fp4_words.data());
  static const Codes codes_static;
  const Codes codes = codes_static;  // the other formats' tables in registers
  constexpr std::size_t kPairBytes = 64, kBlockPairs = kBlock / 2;
  const std::size_t blocks = g.kc / kBlock;
  const PanelStreams<Panels, Codes> streams(g);
  const auto& src = streams.src;
  // Each panel's pairs for two blocks, a block decoded a block ahead of its
  // tile loads (a tile load waits for the stores it reads to reach L1).
  alignas(64) std::uint8_t pairs[2][Panels][kBlockPairs * kPairBytes];
  const auto decode = [&](std::size_t b) __attribute__((always_inline)) {
    for (int p = 0; p < Panels; ++p) {
      std::uint8_t* const out = pairs[b % 2][p];
      if constexpr (kFp4) {
        // Lane l's words 2 l and 2 l + 1: (252 - e) << 7.
        const __m128i e =
            _mm_loadu_si128(reinterpret_cast<const __m128i*>(g.w[p].scales + 16 * (g.k0 / kBlock + b)));
        const __m512i shift = _mm512_slli_epi32(
            _mm512_sub_epi32(_mm512_set1_epi32(kFp4TileScaleTo), _mm512_cvtepu8_epi32(e)), 7);
        const __m512i down = _mm512_or_si512(shift, _mm512_slli_epi32(shift, 16));
        for (std::size_t s = kBlock * b; s < kBlock * (b + 1); s += kFp4GroupSteps) {
          streams.prefetch(p, src[p] + s * Codes::kStepBytes);
          const __m512i group = _mm512_loadu_si512(src[p] + s / kFp4GroupSteps * kFp4GroupBytes);
          std::uint8_t* row = out + (s - kBlock * b) / 2 * kPairBytes;
#pragma GCC unroll 4
          for (unsigned j = 0; j < 4; ++j)  // the group's pair j: each word's nibble j
            _mm512_store_si512(row + j * kPairBytes, _mm512_subs_epu16(
                                                         _mm512_permutexvar_epi16(_mm512_srli_epi16(group, 4 * j), table),
                                                         down));
        }
      } else {
        for (std::size_t s = kBlock * b; s < kBlock * (b + 1); s += 4) {
          streams.prefetch(p, src[p] + s * Codes::kStepBytes);
          __m512i v0, v1;
          codes.two(src[p], s, 4, v0, v1);
          std::uint8_t* row = out + (s - kBlock * b) / 2 * kPairBytes;
          _mm512_store_si512(row, v0);
          _mm512_store_si512(row + kPairBytes, v1);
        }
      }
    }
  };
  const auto zero_sums = [] __attribute__((always_inline)) {
    _tile_zero(4);
    if constexpr (Panels > 1) _tile_zero(5);
    if constexpr (Panels > 2) {
      _tile_zero(6);
      _tile_zero(7);
    }
  };
  const auto store_sums = [&](float* at, long ld) __attribute__((always_inline)) {
    _tile_stored(4, at, ld);
    if constexpr (Panels > 1) _tile_stored(5, at + 16, ld);
    if constexpr (Panels > 2) {
      _tile_stored(6, at + 32, ld);
      _tile_stored(7, at + 48, ld);
    }
  };
  // fp8: S over each scale block's tile products, from +0, stored; C =
  // fma(S, scale, C) in AVX-512 a scale block later, as the tiles do.
  const std::size_t group = g.group;
  alignas(64) float scale_sums[2][kAmxFusedRows * Panels * 16];
  const auto apply_scales = [&](std::size_t q) __attribute__((always_inline)) {
    const float* done = scale_sums[q % 2];
    for (int p = 0; p < Panels; ++p) {
      const __m512 scale = _mm512_loadu_ps(g.scales[p] + 16 * q);
      for (std::size_t r = 0; r < g.rows; ++r) {
        float* c = g.c + r * g.ldc + 16 * p;
        const __m512 before = q == 0 ? _mm512_setzero_ps() : _mm512_loadu_ps(c);
        _mm512_storeu_ps(c, _mm512_fmadd_ps(_mm512_load_ps(done + r * Panels * 16 + 16 * p), scale, before));
      }
    }
  };
  // mxfp4: the next group's scales (its panels' follow these panels'), a
  // share each block, so that the next call's check of them (scales_fit_tiles)
  // and its decode find them in L1 rather than waiting on DRAM.
  const char* next_scales = nullptr;
  std::size_t scale_lines = 0;
  if constexpr (kFp4 && Panels > 1) {
    const std::ptrdiff_t stride = g.w[1].scales - g.w[0].scales;
    next_scales = reinterpret_cast<const char*>(g.w[0].scales + Panels * stride);
    scale_lines = std::size_t(Panels * stride + 63) / 64;
  }
  _tile_loadconfig(&kStreamConfigs.by_rows[g.rows - 1]);
  zero_sums();
  decode(0);
  for (std::size_t b = 0; b < blocks; ++b) {
    for (std::size_t line = b * scale_lines / blocks; line < (b + 1) * scale_lines / blocks; ++line)
      _mm_prefetch(next_scales + 64 * line, _MM_HINT_T0);
    if (b + 1 < blocks) decode(b + 1);
    _tile_loadd(0, g.packed + b * kAmxRows * kBlock, 2 * kBlock);
    MOED_PANEL_PRODUCT(1, 4, pairs[b % 2][0])
    if constexpr (Panels > 1) {
      MOED_PANEL_PRODUCT(2, 5, pairs[b % 2][1])
    }
    if constexpr (Panels > 2) {
      MOED_PANEL_PRODUCT(3, 6, pairs[b % 2][2])
      MOED_PANEL_PRODUCT(1, 7, pairs[b % 2][3])
    }
    if (group != 0 && ((b + 1) % group == 0 || b + 1 == blocks)) {
      const std::size_t q = b / group;
      store_sums(scale_sums[q % 2], long(Panels * 16 * sizeof(float)));
      zero_sums();
      if (q > 0) apply_scales(q - 1);
    }
  }
  if (group != 0) {
    apply_scales((blocks - 1) / group);
  } else {
    store_sums(g.c, long(g.ldc * sizeof(float)));
  }
  _tile_release();
}
#pragma GCC diagnostic pop
#undef MOED_PANEL_PRODUCT

template <int Rows, class Codes>
struct FusedRows {
  static void run(const AmxFusedArgs& g) { Fused<int(amx_fused_panels(Rows)), Rows, Codes>::run(g); }
};

void fused_any(const AmxFusedArgs& g) {
  constexpr auto most = [](QuantPanel::Kind kind) { return int(amx_fused_rows(kind)); };
  pair_codes::run_decoding<FusedRows, most(QuantPanel::bf16), most(QuantPanel::fp8), most(QuantPanel::int8),
                           most(QuantPanel::mxfp4)>(g.w[0].kind, g.rows, g);
}

template <int Panels>
void on_tiles_of(const AmxFusedArgs& g) {
  switch (g.w[0].kind) {
    case QuantPanel::bf16: return on_tiles<Panels, pair_codes::Bf16Codes>(g);
    case QuantPanel::fp8: return on_tiles<Panels, pair_codes::ByteCodes<false>>(g);
    case QuantPanel::int8: return on_tiles<Panels, pair_codes::ByteCodes<true>>(g);
    case QuantPanel::mxfp4: return on_tiles<Panels, Fp4Codes>(g);
  }
}

// The fewest rows at which the other formats run on the tiles: at 1 and 2
// rows their decode tiles, near the bandwidth bound, ran as fast or 5-10%
// faster; at 3 the tiles ran 1.1-1.3x (bf16, fp8; amx_fused_rows() the most).
constexpr std::size_t kTilesFromRows = 3;

// As fused_any, but on the tiles where the range allows.
void fused_or_tiles(const AmxFusedArgs& g) {
  const bool fp4 = g.w[0].kind == QuantPanel::mxfp4;
  if (g.packed != nullptr && g.kc % kBlock == 0 && g.kc > 0 && g.k0 % kBlock == 0 &&
      g.rows >= (fp4 ? 1 : kTilesFromRows) &&
      g.rows <= kAmxFusedRows && (g.group == 0 || g.k0 % (g.group * kBlock) == 0)) {
    const std::size_t panels = amx_fused_panels(g.rows);
    const bool fit = !fp4 || (panels == 4   ? scales_fit_tiles<4>(g)
                              : panels == 2 ? scales_fit_tiles<2>(g)
                                            : scales_fit_tiles<1>(g));
    if (fit) {
      if (panels == 4) return on_tiles_of<4>(g);
      if (panels == 2) return on_tiles_of<2>(g);
      return on_tiles_of<1>(g);
    }
  }
  fused_any(g);
}

}  // namespace

AmxFusedTile avx512_amx_fused_tile(bool with_tiles) { return with_tiles ? fused_or_tiles : fused_any; }

}  // namespace moed::kernels::detail
