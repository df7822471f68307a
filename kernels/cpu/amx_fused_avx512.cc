// The amx products' decode tiles (amx_tile.h's AmxFusedTile): the bits of
// AMX's TDPBF16PS computed with AVX-512 fmas, for the few rows at which a
// tile product, whose cost does not shrink with its rows, would leave the
// core idle. Built with the flags of bf16_dot_avx512.cc (its decoders);
// called only where the CPU has them.
#include <immintrin.h>

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
    const std::uint8_t* src[Panels];
    for (int p = 0; p < Panels; ++p) src[p] = g.w[p].codes + g.k0 * Codes::kStepBytes;
    // As the bf16 products' fused tiles: 1 KB ahead in every stream, and
    // past a stream's end into the same stream of the next group of panels.
    const std::ptrdiff_t stream_bytes = std::ptrdiff_t(g.kc * Codes::kStepBytes);
    const std::ptrdiff_t to_next_group = Panels > 1 ? Panels * (g.w[1].codes - g.w[0].codes) - stream_bytes : 0;
    const auto prefetch = [&](int p, const std::uint8_t* at) __attribute__((always_inline)) {
      std::ptrdiff_t ahead = (at - src[p]) + std::ptrdiff_t(kPrefetchBytes);
      if (ahead >= stream_bytes) ahead += to_next_group;
      _mm_prefetch(reinterpret_cast<const char*>(src[p]) + ahead, _MM_HINT_T0);
    };
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
    prefetch((p), at);                                                                              \
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

template <int Rows, class Codes>
struct FusedRows {
  static void run(const AmxFusedArgs& g) { Fused<int(amx_fused_panels(Rows)), Rows, Codes>::run(g); }
};

void fused_any(const AmxFusedArgs& g) {
  constexpr auto most = [](QuantPanel::Kind kind) { return int(amx_fused_rows(kind)); };
  pair_codes::run_decoding<FusedRows, most(QuantPanel::bf16), most(QuantPanel::fp8), most(QuantPanel::int8),
                           most(QuantPanel::mxfp4)>(g.w[0].kind, g.rows, g);
}

}  // namespace

AmxFusedTile avx512_amx_fused_tile() { return fused_any; }

}  // namespace moed::kernels::detail
