// Counter-based noise for synthetic tokens, vectorised where the CPU allows.
#pragma once

#include <cstddef>
#include <cstdint>

namespace moed::kernels {

// x[i] += factor * CounterRng(key).normalish(i) for i < n: the same bits as
// that scalar loop at every instruction set.
void add_normalish(std::uint64_t key, float factor, float* x, std::size_t n);
// x[i] += factor * d[i] for i < n (one rounding per operation: the same
// bits at every instruction set).
void add_scaled(float factor, const float* d, float* x, std::size_t n);

}  // namespace moed::kernels
