// RequestHistory (runtime/router/policies/request_history.h): the previous
// position's experts per layer, flips, and the bounds (cap, idle timeout).
#include "runtime/router/policies/request_history.h"

#include <gtest/gtest.h>

#include <vector>

#include "tests/unit/test_support.h"

namespace moed::runtime {
namespace {

using Change = RequestHistory::Change;
using E = std::vector<std::uint32_t>;

E previous(const RequestHistory& h, std::uint64_t request, int layer, std::uint32_t position) {
  const auto s = h.previous(request, layer, position);
  return {s.begin(), s.end()};
}

TEST(RequestHistory, GivesThePreviousPositionOfTheSameLayerOnly) {
  RequestHistory h(2, 2, 16, 10);
  EXPECT_EQ(h.record(7, 0, 0, E{3, 1}, 0), Change::unknown);
  EXPECT_EQ(h.record(7, 1, 0, E{2}, 0), Change::unknown);
  EXPECT_EQ(previous(h, 7, 0, 1), (E{3, 1}));
  EXPECT_EQ(previous(h, 7, 1, 1), (E{2}));
  EXPECT_TRUE(previous(h, 7, 0, 2).empty()) << "position 1 was not recorded";
  EXPECT_TRUE(previous(h, 7, 0, 0).empty()) << "a first position has no previous one";
  EXPECT_TRUE(previous(h, 8, 0, 1).empty()) << "another request";
}

TEST(RequestHistory, AFlipIsAChangeOfTheSetNotOfItsOrder) {
  RequestHistory h(1, 2, 16, 10);
  h.record(1, 0, 0, E{3, 1}, 0);
  EXPECT_EQ(h.record(1, 0, 1, E{1, 3}, 1), Change::same);
  EXPECT_EQ(h.record(1, 0, 2, E{1, 4}, 2), Change::flipped);
  EXPECT_EQ(h.record(1, 0, 4, E{1, 4}, 3), Change::unknown) << "position 3 was skipped";
  EXPECT_EQ(h.record(1, 0, 5, E{1}, 4), Change::flipped) << "a subset is another set";
}

TEST(RequestHistory, AFullHistoryForgetsTheLeastRecentlySeen) {
  RequestHistory h(1, 1, 3, 100);
  h.record(10, 0, 0, E{0}, 0);
  h.record(11, 0, 0, E{0}, 1);
  h.record(12, 0, 0, E{0}, 1);
  h.record(10, 0, 1, E{0}, 2);  // 10 seen again: 11 and 12 are older
  h.record(13, 0, 0, E{0}, 3);  // evicts 11 (step 1, lower id than 12)
  EXPECT_EQ(h.size(), 3u);
  EXPECT_TRUE(previous(h, 11, 0, 1).empty());
  EXPECT_FALSE(previous(h, 12, 0, 1).empty());
  EXPECT_FALSE(previous(h, 10, 0, 2).empty());
}

TEST(RequestHistory, ARequestUnseenForIdleStepsIsForgotten) {
  RequestHistory h(1, 1, 16, 2);
  h.record(5, 0, 0, E{1}, 0);
  h.end_step(0);
  h.end_step(1);
  EXPECT_EQ(h.size(), 1u) << "unseen for 1 step";
  h.end_step(2);
  EXPECT_EQ(h.size(), 0u) << "unseen for 2 steps";
}

TEST(RequestHistory, StaysBoundedWhateverTheTraffic) {
  RequestHistory h(2, 2, 100, 1'000'000);
  for (std::uint64_t step = 0; step < 200; ++step) {
    for (std::uint64_t r = 0; r < 50; ++r) h.record(step * 50 + r, int(r % 2), 0, E{1, 2}, step);
    h.end_step(step);
    ASSERT_LE(h.size(), 100u);
  }
}

TEST(RequestHistory, MoreExpertsThanItsKIsAnInternalError) {
  RequestHistory h(1, 2, 4, 4);
  test::expect_error([&] { h.record(1, 0, 0, E{1, 2, 3}, 0); }, ErrorKind::Internal, {"3 experts"});
}

}  // namespace
}  // namespace moed::runtime
