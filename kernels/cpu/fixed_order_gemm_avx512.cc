// The fixed-order GEMM tiles for AVX-512F: up to 12 rows x 16 columns (one
// 16-lane accumulator per row), and up to 12 rows x 32 columns over a pair of
// panels (24 of the 32 vector registers). Compiled with -mavx512f and called only where
// the CPU has it; like the AVX2 file, it includes nothing but the intrinsics
// and fixed_order_tile.h.
#include <immintrin.h>

#include "kernels/cpu/fixed_order_tile.h"

namespace moed::kernels::detail {
namespace {

// Accumulators are named variables, not an array: GCC keeps an array of
// vectors in memory and stores it at every step of k.
#define MOED_ROWS(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7) X(8) X(9) X(10) X(11)

template <int Rows>
struct Tile {
  static void run(const float* a, const float* panel, std::size_t kc, float* c, std::size_t ldc, bool first) {
#define MOED_DECLARE(r) __m512 acc##r = _mm512_setzero_ps();
    MOED_ROWS(MOED_DECLARE)
#undef MOED_DECLARE
    if (!first) {
#define MOED_LOAD(r) \
  if constexpr (r < Rows) acc##r = _mm512_loadu_ps(c + r * ldc);
      MOED_ROWS(MOED_LOAD)
#undef MOED_LOAD
    }
    for (std::size_t kk = 0; kk < kc; ++kk) {
      const __m512 b = _mm512_load_ps(panel + kk * 16);
      const float* x = a + kk * Rows;
#define MOED_STEP(r) \
  if constexpr (r < Rows) acc##r = _mm512_fmadd_ps(_mm512_set1_ps(x[r]), b, acc##r);
      MOED_ROWS(MOED_STEP)
#undef MOED_STEP
    }
#define MOED_STORE(r) \
  if constexpr (r < Rows) _mm512_storeu_ps(c + r * ldc, acc##r);
    MOED_ROWS(MOED_STORE)
#undef MOED_STORE
  }
};

// Two adjacent panels at once (32 columns): each broadcast of A feeds two
// FMAs, which halves the loads of A per FMA. Every lane's chain is the same
// as in Tile, so the bits are too.
template <int Rows>
struct TilePair {
  static void run(const float* a, const float* panel0, const float* panel1, std::size_t kc, float* c,
                  std::size_t ldc, bool first) {
#define MOED_DECLARE(r) __m512 lo##r = _mm512_setzero_ps(), hi##r = _mm512_setzero_ps();
    MOED_ROWS(MOED_DECLARE)
#undef MOED_DECLARE
    if (!first) {
#define MOED_LOAD(r)                            \
  if constexpr (r < Rows) {                     \
    lo##r = _mm512_loadu_ps(c + r * ldc);       \
    hi##r = _mm512_loadu_ps(c + r * ldc + 16);  \
  }
      MOED_ROWS(MOED_LOAD)
#undef MOED_LOAD
    }
    for (std::size_t kk = 0; kk < kc; ++kk) {
      const __m512 b_lo = _mm512_load_ps(panel0 + kk * 16), b_hi = _mm512_load_ps(panel1 + kk * 16);
      const float* x = a + kk * Rows;
#define MOED_STEP(r)                                \
  if constexpr (r < Rows) {                         \
    const __m512 x##r = _mm512_set1_ps(x[r]);       \
    lo##r = _mm512_fmadd_ps(x##r, b_lo, lo##r);     \
    hi##r = _mm512_fmadd_ps(x##r, b_hi, hi##r);     \
  }
      MOED_ROWS(MOED_STEP)
#undef MOED_STEP
    }
#define MOED_STORE(r)                           \
  if constexpr (r < Rows) {                     \
    _mm512_storeu_ps(c + r * ldc, lo##r);       \
    _mm512_storeu_ps(c + r * ldc + 16, hi##r);  \
  }
    MOED_ROWS(MOED_STORE)
#undef MOED_STORE
  }
};
#undef MOED_ROWS

void pair_any(const float* a, std::size_t rows, const float* panel0, const float* panel1, std::size_t kc, float* c,
              std::size_t ldc, bool first) {
  run_rows<TilePair, 12>(rows, a, panel0, panel1, kc, c, ldc, first);
}

void tile_any(const float* a, std::size_t rows, const float* panel, std::size_t kc, float* c, std::size_t ldc,
              bool first) {
  run_rows<Tile, 12>(rows, a, panel, kc, c, ldc, first);
}

}  // namespace

FixedOrderKernel avx512_kernel() { return {tile_any, 12, pair_any}; }

}  // namespace moed::kernels::detail
