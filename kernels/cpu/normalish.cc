#include "kernels/cpu/normalish.h"

#include "kernels/cpu/fixed_order_gemm.h"
#include "kernels/cpu/normalish_body.h"

namespace moed::kernels {

#if MOED_X86_TILES
namespace {
// The loop of the widest instruction set the fixed-order GEMM uses (all give
// the same bits); AVX-512 only with DQ, whose 64-bit multiplies the noise needs.
template <class Loop>
Loop widest(Loop portable, Loop avx2, Loop avx512) {
  switch (gemm_isa()) {
    case GemmIsa::avx512:
      return cpu_has_avx512dq() ? avx512 : avx2;
    case GemmIsa::avx2:
      return avx2;
    case GemmIsa::portable:
      break;
  }
  return portable;
}
}  // namespace
#endif

void add_normalish(std::uint64_t key, float factor, float* x, std::size_t n) {
#if MOED_X86_TILES
  widest(&detail::add_normalish_body, &detail::add_normalish_avx2, &detail::add_normalish_avx512)(key, factor, x, n);
#else
  detail::add_normalish_body(key, factor, x, n);
#endif
}

void add_scaled(float factor, const float* d, float* x, std::size_t n) {
#if MOED_X86_TILES
  widest(&detail::add_scaled_body, &detail::add_scaled_avx2, &detail::add_scaled_avx512)(factor, d, x, n);
#else
  detail::add_scaled_body(factor, d, x, n);
#endif
}

}  // namespace moed::kernels
