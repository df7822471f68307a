#include "kernels/cpu/rms_norm.h"

#include <cmath>

namespace moed::kernels {

void rms_norm(const float* x, const float* weight, std::size_t rows, std::size_t h, float eps,
              float* out) {
  for (std::size_t r = 0; r < rows; ++r) {
    const float* xr = x + r * h;
    double ss = 0;
    for (std::size_t i = 0; i < h; ++i) ss += double(xr[i]) * double(xr[i]);
    const double mean_square = ss / double(h), inv_double = 1.0 / std::sqrt(mean_square + double(eps));
    const float inv = float(inv_double);
    float* o = out + r * h;
    if (std::isinf(inv)) {
      // Only with eps 0 ([model].norm_eps may be 0, or narrow to it in fp32):
      // a zero row, or one whose rms is below 1 / FLT_MAX, has an inverse rms
      // past fp32, and x * inf would give NaN or inf for a finite row. Scaled
      // in double instead; a zero row stays zero, as it does with eps > 0.
      for (std::size_t i = 0; i < h; ++i)
        o[i] = mean_square == 0 ? xr[i] * 0.0f * weight[i] : float(double(xr[i]) * inv_double * double(weight[i]));
      continue;
    }
    for (std::size_t i = 0; i < h; ++i) o[i] = xr[i] * inv * weight[i];
  }
}

}  // namespace moed::kernels
