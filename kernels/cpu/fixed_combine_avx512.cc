// add_weighted_fixed with AVX-512 (F and DQ), eight terms at a time: the
// same bits as the scalar loop in fixed_combine.cc. The product w * y is
// exact in double either way, and vcvtpd2qq rounds by the current mode
// (nearest, ties to even) as llrint does. A group of eight holding any term
// out of range (saturated or non-finite) goes to the scalar loop whole, so
// the rare cases keep one definition.
#include <immintrin.h>

#include "kernels/cpu/fixed_combine.h"

namespace moed::kernels::detail {

std::size_t add_weighted_fixed_scalar(std::int64_t* acc, const float* y, double w, std::size_t h);

std::size_t add_weighted_fixed_avx512(std::int64_t* acc, const float* y, double w, std::size_t h,
                                      double limit) {
  const __m512d scale = _mm512_set1_pd(w), bound = _mm512_set1_pd(limit);
  const __m512i poisoned = _mm512_set1_epi64(kFixedNaN), magnitude = _mm512_set1_epi64(0x7FFF'FFFF'FFFF'FFFF);
  std::size_t saturated = 0, i = 0;
  for (; i + 8 <= h; i += 8) {
    const __m512d t = _mm512_mul_pd(scale, _mm512_mask_cvtps_pd(_mm512_setzero_pd(), 0xFF, _mm256_loadu_ps(y + i)));
    // |t| < limit, false for NaN (ordered compare).
    const __m512d abs_t = _mm512_castsi512_pd(_mm512_and_si512(_mm512_castpd_si512(t), magnitude));
    if (_mm512_cmp_pd_mask(abs_t, bound, _CMP_LT_OQ) != 0xFF) {
      saturated += add_weighted_fixed_scalar(acc + i, y + i, w, 8);
      continue;
    }
    const __m512i a = _mm512_loadu_si512(acc + i);
    const __mmask8 live = _mm512_cmpneq_epi64_mask(a, poisoned);
    _mm512_storeu_si512(acc + i, _mm512_mask_add_epi64(a, live, a, _mm512_cvtpd_epi64(t)));
  }
  return saturated + add_weighted_fixed_scalar(acc + i, y + i, w, h - i);
}

}  // namespace moed::kernels::detail
