#include "kernels/cpu/aligned_scratch.h"

#include <gtest/gtest.h>

#include <cstdint>

namespace moed::kernels::detail {
namespace {

template <class T>
void expect_lines(AlignedScratch<T>& scratch) {
  // Sizes that make the vector reallocate, shrink requests that must not.
  for (std::size_t count : {1u, 7u, 64u, 1000u, 3u, 100000u, 10u}) {
    T* at = scratch.get(count);
    ASSERT_EQ(reinterpret_cast<std::uintptr_t>(at) % 64, 0u) << count << " elements of " << sizeof(T) << " bytes";
    at[0] = T(1);  // the first and the last element are the buffer's own
    at[count - 1] = T(2);
  }
}

TEST(AlignedScratch, EveryBufferStartsOnALine) {
  AlignedScratch<std::int8_t> bytes;
  AlignedScratch<std::uint16_t> codes;
  AlignedScratch<float> floats;
  AlignedScratch<std::int32_t> sums;
  expect_lines(bytes);
  expect_lines(codes);
  expect_lines(floats);
  expect_lines(sums);
}

TEST(AlignedScratch, ASmallerRequestKeepsTheBufferAndItsContents) {
  AlignedScratch<float> scratch;
  float* first = scratch.get(4096);
  for (std::size_t i = 0; i < 4096; ++i) first[i] = float(i);
  float* again = scratch.get(16);
  EXPECT_EQ(first, again);
  EXPECT_EQ(again[15], 15.0f);
}

}  // namespace
}  // namespace moed::kernels::detail
