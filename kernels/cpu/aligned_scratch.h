// A kernel's scratch buffer: grown to the largest call, never shrunk, and
// its first element on a 64-byte line. The tiles and the AVX-512 loads read
// whole 64-byte rows: one that straddles two lines costs two (the AMX tile
// loads of a misaligned buffer measured 2.7x slower on a Xeon).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace moed::kernels::detail {

template <class T>
class AlignedScratch {
 public:
  static constexpr std::size_t kLine = 64;
  static_assert(kLine % sizeof(T) == 0, "an element must divide a cache line");

  // At least count elements from a 64-byte line. A call that grows the
  // buffer leaves its contents unspecified.
  T* get(std::size_t count) {
    constexpr std::size_t slack = kLine / sizeof(T);
    if (storage_.size() < count + slack) storage_.resize(count + slack);
    const std::size_t past = reinterpret_cast<std::uintptr_t>(storage_.data()) % kLine;
    return storage_.data() + (kLine - past) % kLine / sizeof(T);
  }

 private:
  std::vector<T> storage_;
};

}  // namespace moed::kernels::detail
