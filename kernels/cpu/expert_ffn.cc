#include "kernels/cpu/expert_ffn.h"

#include <cstdint>
#include <cstring>

#include "kernels/cpu/gemm.h"
#include "kernels/cpu/silu_body.h"

namespace moed::kernels {

float fast_exp(float x) { return detail::fast_exp_body(x); }

void silu_mul(const float* gate, const float* up, std::size_t n, float* out) {
  // The widest loop the fixed-order GEMM uses: all give the same bits.
#if MOED_X86_TILES
  switch (gemm_isa()) {
    case GemmIsa::avx512:
      return detail::silu_mul_avx512(gate, up, n, out);
    case GemmIsa::avx2:
      return detail::silu_mul_avx2(gate, up, n, out);
    case GemmIsa::portable:
      break;
  }
#endif
  detail::silu_mul_body(gate, up, n, out);
}

void expert_ffn(const ExpertView& e, const float* x, std::size_t m, float* y, float* scratch) {
  const std::size_t F = e.ffn, H = e.hidden;
  float* h13 = scratch;  // [m, 2F]: W1 x in columns [0, F), W3 x in [F, 2F)
  if (e.w13_packed)
    gemm_fixed_order(x, m, *e.w13_packed, h13);
  else
    gemm_xwt(x, m, H, e.w13, 2 * F, h13);
  // Gate in place: the first F columns of each row become silu(W1 x) * (W3 x).
  for (std::size_t r = 0; r < m; ++r) silu_mul(h13 + r * 2 * F, h13 + r * 2 * F + F, F, h13 + r * 2 * F);
  // y = act · W2ᵀ reading act with a row stride of 2F.
  if (e.w2_packed)
    gemm_fixed_order(h13, m, *e.w2_packed, y, /*lda=*/2 * F);
  else
    gemm_xwt(h13, m, F, e.w2, H, y, /*lda=*/2 * F);
}

}  // namespace moed::kernels
