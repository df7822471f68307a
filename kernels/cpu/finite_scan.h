// Finding NaN and +-inf in fp32 data: weights checked at load, expert
// outputs counted at run time. Only the bits are looked at (exponent all
// ones), so the answer holds whatever the floating-point flags.
#pragma once

#include <cstddef>

namespace moed::kernels {

// Index of the first element of x that is NaN or +-inf; n when all are finite.
std::size_t first_nonfinite(const float* x, std::size_t n);

// How many elements of x are NaN or +-inf.
std::size_t count_nonfinite(const float* x, std::size_t n);

}  // namespace moed::kernels
