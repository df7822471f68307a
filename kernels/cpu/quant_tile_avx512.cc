// quant_tile.h's tiles for AVX-512F/BW: up to 12 rows x 16 columns, one
// accumulator per row, each k step's 16 weights decoded in a register by the
// arithmetic of quant_decode_body.h (same operations, same bits).
#include <immintrin.h>

#include "kernels/cpu/quant_tile.h"

namespace moed::kernels::detail {
namespace {

constexpr std::size_t kFp8Group = 128, kMxGroup = 32;

// Each decoder: begin(step) readies the scale of the group holding absolute
// step `step` and returns how many steps that group has left; at(kk) is the
// 16 weights of step kk (relative to the codes it was made with).
struct Bf16 {
  const std::uint8_t* codes;
  std::size_t begin(std::size_t, std::size_t left) { return left; }
  __m512 at(std::size_t kk) const {
    const __m256i c = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(codes + kk * 32));
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(c), 16));
  }
};

struct Fp8 {
  const std::uint8_t* codes;
  const float* tile_scales;  // one per 128 steps
  __m512 scale = _mm512_setzero_ps();
  std::size_t begin(std::size_t step, std::size_t left) {
    scale = _mm512_set1_ps(tile_scales[step / kFp8Group]);
    const std::size_t rest = kFp8Group - step % kFp8Group;
    return rest < left ? rest : left;
  }
  __m512 at(std::size_t kk) const {
    const __m512i c = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(codes + kk * 16)));
    const __m512 magnitude = _mm512_mul_ps(
        _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_and_si512(c, _mm512_set1_epi32(0x7f)), 20)),
        _mm512_set1_ps(0x1p120f));
    const __m512i sign = _mm512_slli_epi32(_mm512_and_si512(c, _mm512_set1_epi32(0x80)), 24);
    return _mm512_mul_ps(_mm512_castsi512_ps(_mm512_or_si512(_mm512_castps_si512(magnitude), sign)), scale);
  }
};

struct Mxfp4 {
  const std::uint8_t* codes;  // the panel's, from step 0
  const std::uint8_t* exps;   // 16 lanes' e8m0 per 32 steps
  std::size_t first;          // the step at(0) decodes
  __m512 scale = _mm512_setzero_ps();
  // fp4_value of each code: exact, so the lookup gives the scalar decoder's value.
  const __m512 values = _mm512_setr_ps(0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f, -0.0f, -0.5f, -1.0f, -1.5f,
                                       -2.0f, -3.0f, -4.0f, -6.0f);
  std::size_t begin(std::size_t step, std::size_t left) {
    const __m512i e =
        _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(exps + step / kMxGroup * 16)));
    const __mmask16 zero = _mm512_cmpeq_epi32_mask(e, _mm512_setzero_si512());
    scale = _mm512_castsi512_ps(
        _mm512_mask_blend_epi32(zero, _mm512_slli_epi32(e, 23), _mm512_set1_epi32(0x00400000)));
    const std::size_t rest = kMxGroup - step % kMxGroup;
    return rest < left ? rest : left;
  }
  // Step s's codes from its group (quant_tile.h): lane l's dword holds its
  // words 2 l and 2 l + 1, the step's nibble 16 (s % 2) + 4 ((s % 8) / 2)
  // bits up; vpermps reads the low 4 bits of each index.
  __m512 at(std::size_t kk) const {
    const std::size_t s = first + kk;
    const __m512i group = _mm512_loadu_si512(codes + s / kFp4GroupSteps * kFp4GroupBytes);
    const int shift = int(16 * (s % 2) + 4 * (s % 8 / 2));
    const __m512i c = _mm512_srl_epi32(group, _mm_cvtsi32_si128(shift));
    return _mm512_mul_ps(_mm512_permutexvar_ps(c, values), scale);
  }
};

struct Int8 {
  const std::uint8_t* codes;
  __m512 scale;  // a row's scale per lane, for every step
  std::size_t begin(std::size_t, std::size_t left) { return left; }
  __m512 at(std::size_t kk) const {
    const __m512i c = _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(codes + kk * 16)));
    return _mm512_mul_ps(_mm512_cvtepi32_ps(c), scale);
  }
};

#define MOED_ROWS(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7) X(8) X(9) X(10) X(11)

template <int Rows>
struct Tile {
  template <class Decode>
  static void run(Decode d, std::size_t k0, const float* a, std::size_t kc, float* c, std::size_t ldc, bool first) {
#define MOED_DECLARE(r) __m512 acc##r = _mm512_setzero_ps();
    MOED_ROWS(MOED_DECLARE)
#undef MOED_DECLARE
    if (!first) {
#define MOED_LOAD(r) \
  if constexpr ((r) < Rows) acc##r = _mm512_loadu_ps(c + (r) * ldc);
      MOED_ROWS(MOED_LOAD)
#undef MOED_LOAD
    }
    for (std::size_t kk = 0; kk < kc;) {
      const std::size_t end = kk + d.begin(k0 + kk, kc - kk);
      for (; kk < end; ++kk) {
        const __m512 b = d.at(kk);
        const float* x = a + kk * Rows;
#define MOED_STEP(r) \
  if constexpr ((r) < Rows) acc##r = _mm512_fmadd_ps(_mm512_set1_ps(x[(r)]), b, acc##r);
        MOED_ROWS(MOED_STEP)
#undef MOED_STEP
      }
    }
#define MOED_STORE(r) \
  if constexpr ((r) < Rows) _mm512_storeu_ps(c + (r) * ldc, acc##r);
    MOED_ROWS(MOED_STORE)
#undef MOED_STORE
  }
};
#undef MOED_ROWS

// Four panels side by side at up to 3 rows: with one accumulator per row,
// each fma waits for the last (4 cycles), so at decode's one row a panel
// alone would run at a quarter of the FMA rate; four panels' chains
// interleave. Each chain is the same as in Tile.
#define MOED_PANELS(X) X(0) X(1) X(2) X(3)
template <int Rows>
struct Tile4 {
  template <class Decode>
  static void run(Decode d0, Decode d1, Decode d2, Decode d3, std::size_t k0, const float* a, std::size_t kc,
                  float* c, std::size_t ldc, bool first) {
#define MOED_DECLARE(p) __m512 r0p##p = _mm512_setzero_ps(), r1p##p = _mm512_setzero_ps(), r2p##p = _mm512_setzero_ps();
    MOED_PANELS(MOED_DECLARE)
#undef MOED_DECLARE
    if (!first) {
#define MOED_LOAD(p)                                                   \
  r0p##p = _mm512_loadu_ps(c + (p) * 16);                                \
  if constexpr (Rows > 1) r1p##p = _mm512_loadu_ps(c + ldc + (p) * 16);  \
  if constexpr (Rows > 2) r2p##p = _mm512_loadu_ps(c + 2 * ldc + (p) * 16);
      MOED_PANELS(MOED_LOAD)
#undef MOED_LOAD
    }
    for (std::size_t kk = 0; kk < kc;) {
      const std::size_t left = kc - kk, end = kk + d0.begin(k0 + kk, left);
      d1.begin(k0 + kk, left), d2.begin(k0 + kk, left), d3.begin(k0 + kk, left);
      for (; kk < end; ++kk) {
        const float* x = a + kk * Rows;
        const __m512 x0 = _mm512_set1_ps(x[0]);
        const __m512 x1 = Rows > 1 ? _mm512_set1_ps(x[Rows > 1 ? 1 : 0]) : x0;
        const __m512 x2 = Rows > 2 ? _mm512_set1_ps(x[Rows > 2 ? 2 : 0]) : x0;
#define MOED_STEP(p)                                                \
  {                                                                 \
    const __m512 b = d##p.at(kk);                                   \
    r0p##p = _mm512_fmadd_ps(x0, b, r0p##p);                        \
    if constexpr (Rows > 1) r1p##p = _mm512_fmadd_ps(x1, b, r1p##p); \
    if constexpr (Rows > 2) r2p##p = _mm512_fmadd_ps(x2, b, r2p##p); \
  }
        MOED_PANELS(MOED_STEP)
#undef MOED_STEP
      }
    }
#define MOED_STORE(p)                                                   \
  _mm512_storeu_ps(c + (p) * 16, r0p##p);                                 \
  if constexpr (Rows > 1) _mm512_storeu_ps(c + ldc + (p) * 16, r1p##p);   \
  if constexpr (Rows > 2) _mm512_storeu_ps(c + 2 * ldc + (p) * 16, r2p##p);
    MOED_PANELS(MOED_STORE)
#undef MOED_STORE
  }
};
#undef MOED_PANELS

template <class Decode, int Max = 12>
void run_rows(std::size_t rows, Decode d, std::size_t k0, const float* a, std::size_t kc, float* c, std::size_t ldc,
              bool first) {
  if constexpr (Max > 1)
    if (rows < std::size_t(Max)) return run_rows<Decode, Max - 1>(rows, d, k0, a, kc, c, ldc, first);
  Tile<Max>::run(d, k0, a, kc, c, ldc, first);
}

template <class Decode>
void run_four(std::size_t rows, const Decode (&d)[4], std::size_t k0, const float* a, std::size_t kc, float* c,
              std::size_t ldc, bool first) {
  if (rows == 1) return Tile4<1>::run(d[0], d[1], d[2], d[3], k0, a, kc, c, ldc, first);
  if (rows == 2) return Tile4<2>::run(d[0], d[1], d[2], d[3], k0, a, kc, c, ldc, first);
  Tile4<3>::run(d[0], d[1], d[2], d[3], k0, a, kc, c, ldc, first);
}

void quant_tile4(const QuantPanel (&w)[4], std::size_t k0, const float* a, std::size_t rows, std::size_t kc,
                 float* c, std::size_t ldc, bool first) {
  switch (w[0].kind) {
    case QuantPanel::bf16: {
      const Bf16 d[4] = {{w[0].codes + k0 * 32}, {w[1].codes + k0 * 32}, {w[2].codes + k0 * 32},
                         {w[3].codes + k0 * 32}};
      return run_four(rows, d, k0, a, kc, c, ldc, first);
    }
    case QuantPanel::fp8: {
      auto one = [&](int p) { return Fp8{w[p].codes + k0 * 16, reinterpret_cast<const float*>(w[p].scales)}; };
      const Fp8 d[4] = {one(0), one(1), one(2), one(3)};
      return run_four(rows, d, k0, a, kc, c, ldc, first);
    }
    case QuantPanel::mxfp4: {
      const Mxfp4 d[4] = {{w[0].codes, w[0].scales, k0}, {w[1].codes, w[1].scales, k0},
                          {w[2].codes, w[2].scales, k0}, {w[3].codes, w[3].scales, k0}};
      return run_four(rows, d, k0, a, kc, c, ldc, first);
    }
    case QuantPanel::int8: {
      auto one = [&](int p) {
        return Int8{w[p].codes + k0 * 16, _mm512_loadu_ps(reinterpret_cast<const float*>(w[p].scales))};
      };
      const Int8 d[4] = {one(0), one(1), one(2), one(3)};
      return run_four(rows, d, k0, a, kc, c, ldc, first);
    }
  }
}

void quant_tile(const QuantPanel& w, std::size_t k0, const float* a, std::size_t rows, std::size_t kc, float* c,
                std::size_t ldc, bool first) {
  switch (w.kind) {
    case QuantPanel::bf16:
      return run_rows(rows, Bf16{w.codes + k0 * 32}, k0, a, kc, c, ldc, first);
    case QuantPanel::fp8:
      return run_rows(rows, Fp8{w.codes + k0 * 16, reinterpret_cast<const float*>(w.scales)}, k0, a, kc, c, ldc,
                      first);
    case QuantPanel::mxfp4:
      return run_rows(rows, Mxfp4{w.codes, w.scales, k0}, k0, a, kc, c, ldc, first);
    case QuantPanel::int8:
      return run_rows(rows, Int8{w.codes + k0 * 16, _mm512_loadu_ps(reinterpret_cast<const float*>(w.scales))}, k0,
                      a, kc, c, ldc, first);
  }
}

}  // namespace

QuantTileKernel avx512_quant_tile() { return quant_tile; }
QuantTile4Kernel avx512_quant_tile4() { return quant_tile4; }

}  // namespace moed::kernels::detail
