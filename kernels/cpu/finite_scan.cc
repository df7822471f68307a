#include "kernels/cpu/finite_scan.h"

#include <cstdint>
#include <bit>

namespace moed::kernels {

namespace {

constexpr std::uint32_t kExponent = 0x7f800000u;
// Elements per block: the block's count is a branch-free loop the compiler
// vectorises; only a block holding a bad element is looked at one by one.
constexpr std::size_t kBlock = 1024;

// Bad elements in x[0, n), n <= kBlock.
std::uint32_t count_block(const float* x, std::size_t n) {
  std::uint32_t bad = 0;
  for (std::size_t i = 0; i < n; ++i) bad += (std::bit_cast<std::uint32_t>(x[i]) & kExponent) == kExponent;
  return bad;
}

}  // namespace

std::size_t first_nonfinite(const float* x, std::size_t n) {
  for (std::size_t first = 0; first < n; first += kBlock) {
    const std::size_t m = n - first < kBlock ? n - first : kBlock;
    if (count_block(x + first, m) == 0) continue;
    for (std::size_t i = first;; ++i)
      if ((std::bit_cast<std::uint32_t>(x[i]) & kExponent) == kExponent) return i;
  }
  return n;
}

std::size_t count_nonfinite(const float* x, std::size_t n) {
  std::size_t bad = 0;
  for (std::size_t first = 0; first < n; first += kBlock)
    bad += count_block(x + first, n - first < kBlock ? n - first : kBlock);
  return bad;
}

}  // namespace moed::kernels
