// The fixed-order GEMM tile for AVX2 + FMA: up to 6 rows x 16 columns, two
// 8-lane accumulators per row. Compiled with -mavx2 -mfma and called only
// where the CPU has both. Like every tile file, it includes nothing but the
// intrinsics and fixed_order_tile.h.
#include <immintrin.h>

#include "kernels/cpu/fixed_order_tile.h"

namespace moed::kernels::detail {
namespace {

// Accumulators are named variables, not an array: GCC keeps an array of
// vectors in memory and stores it at every step of k.
#define MOED_ROWS(X) X(0) X(1) X(2) X(3) X(4) X(5)

template <int Rows>
struct Tile {
  static void run(const float* a, const float* panel, std::size_t kc, float* c, std::size_t ldc, bool first) {
#define MOED_DECLARE(r) __m256 lo##r = _mm256_setzero_ps(), hi##r = _mm256_setzero_ps();
    MOED_ROWS(MOED_DECLARE)
#undef MOED_DECLARE
    if (!first) {
#define MOED_LOAD(r)                            \
  if constexpr (r < Rows) {                     \
    lo##r = _mm256_loadu_ps(c + r * ldc);       \
    hi##r = _mm256_loadu_ps(c + r * ldc + 8);   \
  }
      MOED_ROWS(MOED_LOAD)
#undef MOED_LOAD
    }
    for (std::size_t kk = 0; kk < kc; ++kk) {
      const __m256 b_lo = _mm256_load_ps(panel + kk * 16), b_hi = _mm256_load_ps(panel + kk * 16 + 8);
      const float* x = a + kk * Rows;
#define MOED_STEP(r)                                \
  if constexpr (r < Rows) {                         \
    const __m256 x##r = _mm256_broadcast_ss(x + r); \
    lo##r = _mm256_fmadd_ps(x##r, b_lo, lo##r);     \
    hi##r = _mm256_fmadd_ps(x##r, b_hi, hi##r);     \
  }
      MOED_ROWS(MOED_STEP)
#undef MOED_STEP
    }
#define MOED_STORE(r)                           \
  if constexpr (r < Rows) {                     \
    _mm256_storeu_ps(c + r * ldc, lo##r);       \
    _mm256_storeu_ps(c + r * ldc + 8, hi##r);   \
  }
    MOED_ROWS(MOED_STORE)
#undef MOED_STORE
  }
};
#undef MOED_ROWS

void tile_any(const float* a, std::size_t rows, const float* panel, std::size_t kc, float* c, std::size_t ldc,
              bool first) {
  run_rows<Tile, 6>(rows, a, panel, kc, c, ldc, first);
}

}  // namespace

FixedOrderKernel avx2_kernel() { return {tile_any, 6}; }

}  // namespace moed::kernels::detail
