// The AMX tiles of amx_tile.h: TDPBF16PS on 16 x 16 accumulators, the
// scales applied with AVX-512 fmas, and TDPBSUD for the int8 products.
// Built with -mamx-tile -mamx-bf16 -mamx-int8 -mavx512f and called only
// where the CPU and the OS grant the tiles.
#include <cpuid.h>
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>

#include "kernels/cpu/amx_tile.h"

namespace moed::kernels::detail {

namespace {

// Linux: the tile data state is granted per process, on request.
constexpr long kArchReqXcompPerm = 0x1023;
constexpr long kXfeatureXtileData = 18;

struct TileConfig {
  std::uint8_t palette = 1;
  std::uint8_t start_row = 0;
  std::uint8_t reserved[14] = {};
  std::uint16_t colsb[16] = {};
  std::uint8_t rows[16] = {};
};

// Every tile is 16 rows of 64 bytes: tmm0-3 the accumulators C[rt][q]
// (2 rt + q), tmm4-5 the activations of row tile rt (AmxPack's layout: a
// block's 16 rows 64 bytes apart), tmm6-7 panel q's pairs.
constexpr TileConfig sixteen_by_64() {
  TileConfig config;
  for (int t = 0; t < 8; ++t) {
    config.colsb[t] = 64;
    config.rows[t] = 16;
  }
  return config;
}
// In memory, not built on the stack: GCC 12 drops a local configuration's
// stores, as if ldtilecfg did not read them.
alignas(64) const TileConfig kTiles = sixteen_by_64();

void enter() { _tile_loadconfig(&kTiles); }

void leave() { _tile_release(); }

// GCC's tile intrinsics take the tile's number as a literal token: each
// accumulator by name, the switch folded away at each (constant) call.
// Accumulator t (2 rt + q) of a block of accumulators ldc elements of
// Element apart (fp32 or int32 alike: 16 x 16 of 4 bytes).
template <class Element>
inline void load_c(int tile, const Element* c, std::size_t ldc) {
  const Element* at = c + (tile / 2) * kAmxRows * ldc + (tile % 2) * kAmxRows;
  const long bytes = long(ldc * sizeof(Element));
  switch (tile) {
    case 0: _tile_loadd(0, at, bytes); break;
    case 1: _tile_loadd(1, at, bytes); break;
    case 2: _tile_loadd(2, at, bytes); break;
    default: _tile_loadd(3, at, bytes); break;
  }
}
template <class Element>
inline void store_c(int tile, Element* c, std::size_t ldc) {
  Element* at = c + (tile / 2) * kAmxRows * ldc + (tile % 2) * kAmxRows;
  const long bytes = long(ldc * sizeof(Element));
  switch (tile) {
    case 0: _tile_stored(0, at, bytes); break;
    case 1: _tile_stored(1, at, bytes); break;
    case 2: _tile_stored(2, at, bytes); break;
    default: _tile_stored(3, at, bytes); break;
  }
}
inline void zero_c(int tile) {
  switch (tile) {
    case 0: _tile_zero(0); break;
    case 1: _tile_zero(1); break;
    case 2: _tile_zero(2); break;
    default: _tile_zero(3); break;
  }
}

// Every accumulator the call has (2 rt + q for rt < Rows, q < Panels).
template <int Rows, int Panels, class F>
inline void each_tile(F&& f) {
  f(0);
  if constexpr (Panels > 1) f(1);
  if constexpr (Rows > 1) f(2);
  if constexpr (Rows > 1 && Panels > 1) f(3);
}

// Blocks [b0, b1) into the accumulators.
template <int Rows, int Panels>
inline void products(const AmxTileArgs& g, std::size_t b0, std::size_t b1) {
  constexpr long a_bytes = kAmxBlock * sizeof(std::uint16_t);
  for (std::size_t b = b0; b < b1; ++b) {
    const std::uint16_t* a = g.a + b * kAmxRows * kAmxBlock;
    _tile_loadd(4, a, a_bytes);
    if constexpr (Rows > 1) _tile_loadd(5, a + g.a_tile, a_bytes);
    _tile_loadd(6, g.b[0] + b * kAmxRows * 32, 64);
    if constexpr (Panels > 1) _tile_loadd(7, g.b[1] + b * kAmxRows * 32, 64);
    _tile_dpbf16ps(0, 4, 6);
    if constexpr (Panels > 1) _tile_dpbf16ps(1, 4, 7);
    if constexpr (Rows > 1) _tile_dpbf16ps(2, 5, 6);
    if constexpr (Rows > 1 && Panels > 1) _tile_dpbf16ps(3, 5, 7);
  }
}

template <int Rows, int Panels>
void tile(const AmxTileArgs& g) {
  if (g.group == 0) {
    each_tile<Rows, Panels>([&](int t) { g.first ? zero_c(t) : load_c(t, g.c, g.ldc); });
    products<Rows, Panels>(g, 0, g.blocks);
    each_tile<Rows, Panels>([&](int t) { store_c(t, g.c, g.ldc); });
    return;
  }
  // Scale block s's sums are stored, then block s + 1's products issued
  // before s's fmas: the tiles run while the vector unit applies the scales.
  alignas(64) float sums[2][2 * kAmxRows * 2 * kAmxRows];
  const std::size_t scale_blocks = (g.blocks + g.group - 1) / g.group;
  const auto issue = [&](std::size_t s) {
    each_tile<Rows, Panels>([&](int t) { zero_c(t); });
    products<Rows, Panels>(g, s * g.group, (s + 1) * g.group < g.blocks ? (s + 1) * g.group : g.blocks);
  };
  issue(0);
  for (std::size_t s = 0; s < scale_blocks; ++s) {
    float* done = sums[s % 2];
    each_tile<Rows, Panels>([&](int t) { store_c(t, done, std::size_t(2 * kAmxRows)); });
    if (s + 1 < scale_blocks) issue(s + 1);
    const bool from_zero = g.first && s == 0;
    for (int q = 0; q < Panels; ++q) {
      const __m512 scale = _mm512_loadu_ps(g.scales[q] + 16 * s);
      for (int r = 0; r < Rows * int(kAmxRows); ++r) {
        float* c = g.c + r * g.ldc + q * kAmxRows;
        const __m512 sum = _mm512_load_ps(done + r * 2 * kAmxRows + q * kAmxRows);
        _mm512_storeu_ps(c, _mm512_fmadd_ps(sum, scale, from_zero ? _mm512_setzero_ps() : _mm512_loadu_ps(c)));
      }
    }
  }
}

void tile_any(const AmxTileArgs& g) {
  if (g.row_tiles > 1) return g.panels > 1 ? tile<2, 2>(g) : tile<2, 1>(g);
  return g.panels > 1 ? tile<1, 2>(g) : tile<1, 1>(g);
}

template <int Rows, int Panels>
void int8_tile(const AmxInt8Args& g) {
  each_tile<Rows, Panels>([&](int t) { g.first ? zero_c(t) : load_c(t, g.c, kAmxLdc); });
  constexpr long a_bytes = 64;
  for (std::size_t b = 0; b < g.blocks; ++b) {
    const std::int8_t* a = g.a + b * kAmxRows * 64;
    _tile_loadd(4, a, a_bytes);
    if constexpr (Rows > 1) _tile_loadd(5, a + g.a_tile, a_bytes);
    _tile_loadd(6, g.b[0] + b * 1024, 64);
    if constexpr (Panels > 1) _tile_loadd(7, g.b[1] + b * 1024, 64);
    _tile_dpbsud(0, 4, 6);
    if constexpr (Panels > 1) _tile_dpbsud(1, 4, 7);
    if constexpr (Rows > 1) _tile_dpbsud(2, 5, 6);
    if constexpr (Rows > 1 && Panels > 1) _tile_dpbsud(3, 5, 7);
  }
  each_tile<Rows, Panels>([&](int t) { store_c(t, g.c, kAmxLdc); });
}

void int8_tile_any(const AmxInt8Args& g) {
  if (g.row_tiles > 1) return g.panels > 1 ? int8_tile<2, 2>(g) : int8_tile<2, 1>(g);
  return g.panels > 1 ? int8_tile<1, 2>(g) : int8_tile<1, 1>(g);
}

// weight_codes.cc's bf16_code on 16 floats: round to nearest even by integer
// adds, a NaN's top half with the quiet bit set.
inline __m256i bf16_codes(__m512 x) {
  const __m512i bits = _mm512_castps_si512(x);
  const __m512i high = _mm512_srli_epi32(bits, 16);
  const __m512i rounding = _mm512_add_epi32(_mm512_set1_epi32(0x7fff), _mm512_and_si512(high, _mm512_set1_epi32(1)));
  __m512i code = _mm512_srli_epi32(_mm512_add_epi32(bits, rounding), 16);
  code = _mm512_mask_or_epi32(code, _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q), high, _mm512_set1_epi32(0x40));
  return _mm512_cvtepi32_epi16(code);
}

void pack(const float* a, std::size_t lda, std::size_t m, std::size_t k, std::size_t k_pad, std::uint16_t* out) {
  for (std::size_t i = 0; i < m; ++i) {
    const float* src = a + i * lda;
    // 16 steps at a time: half a block, never across one.
    for (std::size_t j = 0; j < k_pad; j += 16) {
      const __mmask16 valid = j + 16 <= k ? __mmask16(0xffff) : j < k ? __mmask16((1u << (k - j)) - 1) : 0;
      const __m256i codes = _mm256_maskz_mov_epi16(valid, bf16_codes(_mm512_maskz_loadu_ps(valid, src + j)));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + amx_packed_at(i, j, k_pad)), codes);
    }
  }
}

// A pair row's 32 values: lanes 0-7 (each twice) in the low half, 8-15 in the high.
void scale_pairs(std::uint16_t* pairs, std::size_t npairs, const float* scales) {
  const __m512i low_lanes = _mm512_set_epi32(7, 7, 6, 6, 5, 5, 4, 4, 3, 3, 2, 2, 1, 1, 0, 0);
  const __m512i high_lanes = _mm512_add_epi32(low_lanes, _mm512_set1_epi32(8));
  for (std::size_t t = 0; t < npairs; ++t) {
    const __m512 lane_scales = _mm512_loadu_ps(scales + 16 * (t / 16));
    std::uint16_t* row = pairs + 32 * t;
    for (int half = 0; half < 2; ++half) {
      const __m256i codes = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(row + 16 * half));
      const __m512 w = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(codes), 16));
      const __m512 scaled = _mm512_mul_ps(w, _mm512_permutexvar_ps(half ? high_lanes : low_lanes, lane_scales));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(row + 16 * half),
                          _mm512_cvtepi32_epi16(_mm512_srli_epi32(_mm512_castps_si512(scaled), 16)));
    }
  }
}

}  // namespace

bool cpu_reports_amx() {
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  if (!__get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx)) return false;
  const bool amx_bf16 = edx & (1u << 22), amx_tile = edx & (1u << 24);
  if (!amx_bf16 || !amx_tile) return false;
  if (!__get_cpuid(1, &eax, &ebx, &ecx, &edx) || !(ecx & (1u << 27))) return false;  // OSXSAVE
  unsigned lo = 0, hi = 0;
  __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  return (lo & (3u << 17)) == (3u << 17);  // XTILECFG and XTILEDATA enabled
}

bool cpu_reports_amx_int8() {
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  return cpu_reports_amx() && __get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx) && (edx & (1u << 25));
}

AmxInt8Tile amx_int8_tile() { return int8_tile_any; }

bool request_amx_state() {
  static const bool granted = syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtileData) == 0;
  return granted;
}

AmxKernels amx_tile_kernels() {
  return {avx512_bf16_dot_kernels().decode, scale_pairs, pack, tile_any, enter, leave, avx512_amx_fused_tile(true)};
}

}  // namespace moed::kernels::detail
