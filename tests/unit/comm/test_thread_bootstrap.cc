// The in-process Bootstrap: its collectives over threads give every rank the
// same answer, and ranks that disagree on which collective they are in, or
// one that never comes, end with an error instead of hanging.
#include "comm/thread_bootstrap.h"

#include <gtest/gtest.h>

#include <atomic>
#include <string>
#include <vector>

#include "tests/unit/comm/run_ranks.h"
#include "tests/unit/test_support.h"

namespace moed::comm {
namespace {

constexpr int kRanks = 4;

std::vector<std::byte> bytes_of(const std::string& s) {
  const auto b = std::as_bytes(std::span(s));
  return {b.begin(), b.end()};
}

TEST(ThreadBootstrap, AllGatherGivesEveryRankEveryPartInRankOrder) {
  test::run_ranks(kRanks, [](Bootstrap& b) {
    for (int round = 0; round < 3; ++round) {
      // Lengths differ by rank (rank 0's part is empty).
      const std::string mine(std::size_t(b.rank()) * 3, char('a' + b.rank() + round));
      const auto all = b.all_gather(std::as_bytes(std::span(mine)), "parts");
      ASSERT_EQ(all.size(), std::size_t(kRanks));
      for (int r = 0; r < kRanks; ++r)
        EXPECT_EQ(all[std::size_t(r)], bytes_of(std::string(std::size_t(r) * 3, char('a' + r + round))))
            << "rank " << b.rank() << " round " << round << " part of rank " << r;
    }
  });
}

TEST(ThreadBootstrap, AllReduceTakesTheMaximumOrTheSumOfEachValue) {
  test::run_ranks(kRanks, [](Bootstrap& b) {
    std::vector<std::int64_t> values{b.rank(), -10 * b.rank(), 1};
    b.all_reduce(values, Bootstrap::Reduction::max, "max");
    EXPECT_EQ(values, (std::vector<std::int64_t>{kRanks - 1, 0, 1}));
    values = {b.rank(), -10 * b.rank(), 1};
    b.all_reduce(values, Bootstrap::Reduction::sum, "sum");
    EXPECT_EQ(values, (std::vector<std::int64_t>{6, -60, kRanks}));
    EXPECT_EQ(b.all_max(b.rank() == 2 ? 7 : 0, "all_max"), 7);
  });
}

TEST(ThreadBootstrap, ABarrierProgressesWhileItWaits) {
  std::atomic<int> arrived{0};
  test::run_ranks(2, [&](Bootstrap& b) {
    int polls = 0;
    // Rank 0 comes first and polls until rank 1, which waits for one of
    // those polls before it comes.
    if (b.rank() == 1)
      while (arrived.load() == 0) std::this_thread::yield();
    b.barrier("barrier", [&] {
      ++polls;
      if (b.rank() == 0) arrived.store(1);
    });
    if (b.rank() == 0) {
      EXPECT_GT(polls, 0);
    }
  });
}

TEST(ThreadBootstrap, RanksInDifferentCollectivesFail) {
  test::expect_error(
      [] {
        test::run_ranks(
            2, [](Bootstrap& b) { b.barrier(b.rank() == 0 ? "teardown" : "start", {}); },
            std::chrono::milliseconds(200));
      },
      ErrorKind::Internal, {"\"start\"", "\"teardown\""});
}

TEST(ThreadBootstrap, ARankThatNeverComesEndsTheWaitAtTheDeadline) {
  test::expect_error(
      [] {
        test::run_ranks(
            3, [](Bootstrap& b) {
              if (b.rank() != 2) b.barrier("the rank that stays away", {});
            },
            std::chrono::milliseconds(100));
      },
      ErrorKind::Runtime, {"the rank that stays away", "deadline of 100 ms", "ranks [2] have not come"});
}

}  // namespace
}  // namespace moed::comm
