// The expert heatmap's ring: columns sum whole groups of steps, only the
// last `columns` stay, and a layer's view is its slice, oldest first.
#include "runtime/observe/load_heatmap.h"

#include <gtest/gtest.h>

#include "common/error.h"

namespace moed::runtime {
namespace {

// 2 layers x 3 experts; step s puts s on layer 0 expert (s % 3) and 100 + s on layer 1 expert 0.
std::vector<std::uint64_t> step_loads(std::uint64_t s) {
  std::vector<std::uint64_t> v(6, 0);
  v[s % 3] = s;
  v[3] = 100 + s;
  return v;
}

struct Ring {
  int columns, column_steps, steps;
};
class LoadHeatmapRing : public ::testing::TestWithParam<Ring> {};

TEST_P(LoadHeatmapRing, KeepsTheLastWholeColumns) {
  const auto [columns, column_steps, steps] = GetParam();
  LoadHeatmap h(2, 3, columns, column_steps);
  for (int s = 0; s < steps; ++s) h.add_step(step_loads(std::uint64_t(s)));
  const int complete = steps / column_steps;
  const int kept = std::min(complete, columns);
  const std::vector<LoadHeatmap::Column> l0 = h.layer(0), l1 = h.layer(1);
  ASSERT_EQ(int(l0.size()), kept);
  ASSERT_EQ(int(l1.size()), kept);
  for (int i = 0; i < kept; ++i) {
    const int column = complete - kept + i;  // oldest first
    const std::uint64_t first = std::uint64_t(column * column_steps), last = first + std::uint64_t(column_steps) - 1;
    EXPECT_EQ(l0[std::size_t(i)].first_step, first);
    EXPECT_EQ(l0[std::size_t(i)].last_step, last);
    std::vector<std::uint64_t> want0(3, 0);
    std::uint64_t want1 = 0;
    for (std::uint64_t s = first; s <= last; ++s) want0[s % 3] += s, want1 += 100 + s;
    EXPECT_EQ(l0[std::size_t(i)].load, want0) << "column " << column;
    EXPECT_EQ(l1[std::size_t(i)].load, (std::vector<std::uint64_t>{want1, 0, 0})) << "column " << column;
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, LoadHeatmapRing,
                         ::testing::Values(Ring{4, 1, 3}, Ring{4, 1, 4}, Ring{4, 1, 11}, Ring{3, 2, 5}, Ring{3, 2, 20},
                                           Ring{1, 5, 23}, Ring{5, 3, 2}));

TEST(LoadHeatmap, NoColumnsKeepsNothing) {
  LoadHeatmap h(2, 3, 0, 1);
  for (int s = 0; s < 10; ++s) h.add_step(step_loads(std::uint64_t(s)));
  EXPECT_TRUE(h.layer(1).empty());
}

TEST(LoadHeatmap, RefusesLoadsOfAnotherShapeAndLayersOutOfRange) {
  LoadHeatmap h(2, 3, 4, 1);
  EXPECT_THROW(h.add_step(std::vector<std::uint64_t>(5, 1)), Error);
  EXPECT_THROW(h.layer(2), Error);
  EXPECT_THROW(h.layer(-1), Error);
}

}  // namespace
}  // namespace moed::runtime
