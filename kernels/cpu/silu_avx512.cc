// silu_body.h's loop built with -mavx512f (16 lanes); see there.
#include "kernels/cpu/silu_body.h"

namespace moed::kernels::detail {
void silu_mul_avx512(const float* gate, const float* up, std::size_t n, float* out) {
  silu_mul_body(gate, up, n, out);
}
}  // namespace moed::kernels::detail
