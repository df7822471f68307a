#include "kernels/cpu/finite_scan.h"

#include <gtest/gtest.h>

#include <limits>
#include <vector>

namespace moed::kernels {
namespace {

constexpr float kNan = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();

TEST(FiniteScan, AllFinite) {
  const std::vector<float> x = {0.0f, -0.0f, 1.0f, std::numeric_limits<float>::max(),
                                std::numeric_limits<float>::denorm_min(), -3e38f};
  EXPECT_EQ(first_nonfinite(x.data(), x.size()), x.size());
  EXPECT_EQ(count_nonfinite(x.data(), x.size()), 0u);
  EXPECT_EQ(first_nonfinite(nullptr, 0), 0u);
}

// Across block boundaries (1024 elements) and in the ragged tail.
TEST(FiniteScan, FindsTheFirstAndCountsAll) {
  for (float bad : {kNan, -kNan, kInf, -kInf}) {
    std::vector<float> x(5000, 0.5f);
    x[4999] = bad;
    EXPECT_EQ(first_nonfinite(x.data(), x.size()), 4999u);
    x[1024] = bad;
    x[3000] = bad;
    EXPECT_EQ(first_nonfinite(x.data(), x.size()), 1024u);
    EXPECT_EQ(count_nonfinite(x.data(), x.size()), 3u);
    EXPECT_EQ(first_nonfinite(x.data(), 1024), 1024u);  // only the first block looked at
  }
}

}  // namespace
}  // namespace moed::kernels
