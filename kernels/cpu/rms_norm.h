// RMSNorm, the normalisation in front of each MoE block (Mixtral's
// post_attention_layernorm): out = x / sqrt(mean(x²) + eps) * weight.
#pragma once

#include <cstddef>

namespace moed::kernels {

// Rows of h floats; the sum of squares is accumulated in double, in order.
// With eps 0 too, a finite row's scale stays finite (a zero row gives zeros).
void rms_norm(const float* x, const float* weight, std::size_t rows, std::size_t h, float eps,
              float* out);

}  // namespace moed::kernels
