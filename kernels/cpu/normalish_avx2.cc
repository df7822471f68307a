// normalish_body.h's loop built with -mavx2; see there.
#include "kernels/cpu/normalish_body.h"

namespace moed::kernels::detail {
void add_normalish_avx2(std::uint64_t key, float factor, float* x, std::size_t n) {
  add_normalish_body(key, factor, x, n);
}
void add_scaled_avx2(float factor, const float* d, float* x, std::size_t n) { add_scaled_body(factor, d, x, n); }
}  // namespace moed::kernels::detail
