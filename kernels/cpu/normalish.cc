#include "kernels/cpu/normalish.h"

#include "kernels/cpu/fixed_order_gemm.h"
#include "kernels/cpu/normalish_body.h"

namespace moed::kernels {

void add_normalish(std::uint64_t key, float factor, float* x, std::size_t n) {
  // The widest loop the fixed-order GEMM uses: all give the same bits.
#if MOED_X86_TILES
  static const bool has_dq = __builtin_cpu_supports("avx512dq");  // 64-bit multiplies in vectors
  switch (gemm_isa()) {
    case GemmIsa::avx512:
      if (has_dq) return detail::add_normalish_avx512(key, factor, x, n);
      [[fallthrough]];
    case GemmIsa::avx2:
      return detail::add_normalish_avx2(key, factor, x, n);
    case GemmIsa::portable:
      break;
  }
#endif
  detail::add_normalish_body(key, factor, x, n);
}

void add_scaled(float factor, const float* d, float* x, std::size_t n) {
#if MOED_X86_TILES
  switch (gemm_isa()) {
    case GemmIsa::avx512:
      return detail::add_scaled_avx512(factor, d, x, n);
    case GemmIsa::avx2:
      return detail::add_scaled_avx2(factor, d, x, n);
    case GemmIsa::portable:
      break;
  }
#endif
  detail::add_scaled_body(factor, d, x, n);
}

}  // namespace moed::kernels
