#include "comm/idle_backoff.h"

#include <gtest/gtest.h>

#include <vector>

namespace moed::comm {
namespace {

struct Case {
  const char* name;
  WaitPolicy policy;
  std::vector<Pause> expected;  // after idle polls 1, 2, ...
};

std::ostream& operator<<(std::ostream& os, const Case& c) { return os << c.name; }

class PauseSchedule : public ::testing::TestWithParam<Case> {};

TEST_P(PauseSchedule, SpinsYieldsThenSleepsDoublingToTheCap) {
  const Case& c = GetParam();
  for (std::size_t i = 0; i < c.expected.size(); ++i) {
    const Pause got = pause_after(std::int64_t(i) + 1, c.policy);
    EXPECT_EQ(got.kind, c.expected[i].kind) << "after idle poll " << i + 1;
    if (got.kind == Pause::sleep) {
      EXPECT_EQ(got.us, c.expected[i].us) << "after idle poll " << i + 1;
    }
  }
}

constexpr Pause spin{Pause::spin}, yield{Pause::yield};
Pause sleep(std::int64_t us) { return {Pause::sleep, us}; }

INSTANTIATE_TEST_SUITE_P(
    IdleBackoff, PauseSchedule,
    ::testing::Values(
        Case{"phases", {2, 1, 20, 100}, {spin, spin, yield, sleep(20), sleep(40), sleep(80), sleep(100), sleep(100)}},
        Case{"no_growth_when_the_cap_is_below", {0, 0, 50, 10}, {sleep(50), sleep(50), sleep(50)}},
        Case{"cap_equal", {0, 0, 30, 30}, {sleep(30), sleep(30)}},
        Case{"zero_first_sleep_grows_from_one", {0, 0, 0, 4}, {sleep(0), sleep(1), sleep(2), sleep(4), sleep(4)}},
        Case{"yield_only_before_sleeping", {0, 3, 5, 5}, {yield, yield, yield, sleep(5)}}),
    [](const auto& info) { return std::string(info.param.name); });

TEST(PauseSchedule, ALongWaitNeitherOverflowsNorPassesTheCap) {
  const WaitPolicy policy{32, 2048, 20, 1000};
  EXPECT_EQ(pause_after(std::int64_t(1) << 40, policy).us, 1000);
  EXPECT_EQ(pause_after(32 + 2048 + 1, policy).us, 20);
}

}  // namespace
}  // namespace moed::comm
