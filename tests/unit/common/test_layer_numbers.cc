// LayerNumbers: MoE layer indices to the model's own layer numbers and back.
#include "common/layer_numbers.h"

#include <gtest/gtest.h>

#include "common/error.h"
#include "tests/unit/test_support.h"

namespace moed {
namespace {

TEST(LayerNumbers, WithoutDenseLayersEveryLayerIsItsOwnNumber) {
  const LayerNumbers n;
  EXPECT_TRUE(n.identity());
  EXPECT_EQ(n.model(3), 3);
  EXPECT_EQ(n.moe(3, 4), 3);
  EXPECT_EQ(n.moe(4, 4), std::nullopt);
  EXPECT_EQ(n.moe(-1, 4), std::nullopt);
  EXPECT_EQ(n.all(3), (std::vector<int>{0, 1, 2}));
  EXPECT_EQ(n.why_not(4, 4), "layer 4 is not one of the model's MoE layers (0-3)");
}

TEST(LayerNumbers, DenseLayersTakeNumbers) {
  // DeepSeek-V3's shape in small: model layers 0-2 dense, 3-5 MoE, 6 dense, 7 MoE.
  const LayerNumbers n({3, 4, 5, 7});
  EXPECT_FALSE(n.identity());
  EXPECT_EQ(n.model(0), 3);
  EXPECT_EQ(n.model(3), 7);
  EXPECT_EQ(n.moe(3, 4), 0);
  EXPECT_EQ(n.moe(7, 4), 3);
  EXPECT_EQ(n.moe(2, 4), std::nullopt);
  EXPECT_EQ(n.moe(6, 4), std::nullopt);
  EXPECT_EQ(n.moe(8, 4), std::nullopt);
  EXPECT_EQ(n.all(4), (std::vector<int>{3, 4, 5, 7}));
  EXPECT_EQ(n.why_not(6, 4), "layer 6 is not one of the model's MoE layers (3-5,7)");
  EXPECT_EQ(n.why_not(9, 4), "layer 9 is not one of the model's MoE layers (3-5,7)");
  test::expect_error([&] { n.model(4); }, ErrorKind::Internal, {"MoE layer 4 of 4"});
}

TEST(LayerNumbers, AListThatDoesNotAscendIsRefused) {
  test::expect_error([] { LayerNumbers({3, 3}); }, ErrorKind::Internal, {"ascend"});
  test::expect_error([] { LayerNumbers({-1, 2}); }, ErrorKind::Internal, {"ascend"});
  EXPECT_TRUE(LayerNumbers({0, 1, 2}).identity());
}

}  // namespace
}  // namespace moed
