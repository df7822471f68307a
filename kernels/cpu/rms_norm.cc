#include "kernels/cpu/rms_norm.h"

#include <cmath>

namespace moed::kernels {

void rms_norm(const float* x, const float* weight, std::size_t rows, std::size_t h, float eps,
              float* out) {
  for (std::size_t r = 0; r < rows; ++r) {
    const float* xr = x + r * h;
    double ss = 0;
    for (std::size_t i = 0; i < h; ++i) ss += double(xr[i]) * double(xr[i]);
    float inv = float(1.0 / std::sqrt(ss / double(h) + double(eps)));
    float* o = out + r * h;
    for (std::size_t i = 0; i < h; ++i) o[i] = xr[i] * inv * weight[i];
  }
}

}  // namespace moed::kernels
