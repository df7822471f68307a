// Which token sits at each position of a step: in order, or one permutation
// per step that every rank draws alike.
#include "runtime/workload/token_order.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <vector>

namespace moed::runtime {
namespace {

TEST(TokenOrder, SequentialIsTheIdentity) {
  TokenOrder order(100, false, 7);
  std::vector<std::uint64_t> ids;
  order.ids(3, 40, 5, ids);
  EXPECT_EQ(ids, (std::vector<std::uint64_t>{340, 341, 342, 343, 344}));
  std::vector<std::uint32_t> positions;
  order.positions(3, positions);
  for (std::uint32_t t = 0; t < 100; ++t) EXPECT_EQ(positions[t], t);
}

class ShuffledOrder : public ::testing::TestWithParam<std::uint64_t> {};

TEST_P(ShuffledOrder, EachStepServesItsOwnTokensOnceInAnotherOrder) {
  const std::uint64_t T = GetParam(), step = 5;
  TokenOrder order(T, true, 7);
  std::vector<std::uint64_t> all;
  order.ids(step, 0, T, all);
  std::vector<std::uint64_t> sorted = all;
  std::sort(sorted.begin(), sorted.end());
  std::vector<std::uint64_t> want(T);
  std::iota(want.begin(), want.end(), step * T);
  EXPECT_EQ(sorted, want) << "a permutation of the step's tokens";
  if (T > 8) {
    EXPECT_NE(all, want) << "not the identity";
  }

  // A rank's share is the same slice of the step's permutation.
  std::vector<std::uint64_t> part;
  order.ids(step, T / 3, T / 2, part);
  EXPECT_TRUE(std::equal(part.begin(), part.end(), all.begin() + std::ptrdiff_t(T / 3)));

  // positions() inverts it.
  std::vector<std::uint32_t> positions;
  order.positions(step, positions);
  for (std::uint64_t p = 0; p < T; ++p) EXPECT_EQ(positions[all[p] - step * T], p);
}

INSTANTIATE_TEST_SUITE_P(TokensPerStep, ShuffledOrder, ::testing::Values(1, 2, 97, 512));

TEST(TokenOrder, ShuffledDiffersByStepAndSeedButNotByCall) {
  std::vector<std::uint64_t> a, b, c, d;
  TokenOrder(64, true, 7).ids(1, 0, 64, a);
  TokenOrder(64, true, 7).ids(1, 0, 64, b);
  TokenOrder(64, true, 8).ids(1, 0, 64, c);
  TokenOrder(64, true, 7).ids(2, 0, 64, d);
  EXPECT_EQ(a, b);
  EXPECT_NE(a, c);
  for (auto& id : d) id -= 64;  // step 2's tokens, moved to step 1's ids
  EXPECT_NE(a, d);
}

// last_step_of_request inverts request_of_token: every token of a request is
// served at or before its last step, and that step serves one of them.
struct RequestShape {
  std::uint64_t tokens_per_step, positions_per_request;
};
class LastStepOfRequest : public ::testing::TestWithParam<RequestShape> {};

TEST_P(LastStepOfRequest, IsTheStepOfTheRequestsLastPosition) {
  const auto [T, P] = GetParam();
  for (std::uint64_t id = 0; id < 12 * T * P; ++id) {
    const TokenTag tag = request_of_token(id, T, P);
    const std::uint64_t step = id / T, last = last_step_of_request(tag.request, T, P);
    EXPECT_LE(step, last) << "token " << id;
    EXPECT_EQ(last - step, P - 1 - tag.position) << "token " << id << " at position " << tag.position;
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, LastStepOfRequest,
                         ::testing::Values(RequestShape{1, 1}, RequestShape{100, 1}, RequestShape{64, 4},
                                           RequestShape{7, 3}));

}  // namespace
}  // namespace moed::runtime
