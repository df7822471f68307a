// The fencing lease (comm/fencing_lease.h): a rank answers a step's outputs
// only while less than the lease has passed since the step began; the
// lease is [comm].lease_ms, or half the deadline by default.
#include "comm/fencing_lease.h"

#include <gtest/gtest.h>

namespace moed::comm {
namespace {

using namespace std::chrono_literals;

TEST(FencingLease, HoldsUntilItsLengthHasPassedSinceTheStepBegan) {
  FencingLease lease(1000ms);
  const auto t0 = FencingLease::Clock::time_point{} + 5s;
  lease.begin(t0);
  EXPECT_TRUE(lease.holds(t0));
  EXPECT_TRUE(lease.holds(t0 + 999ms));
  EXPECT_FALSE(lease.holds(t0 + 1000ms)) << "at its length the others may be about to decide";
  EXPECT_FALSE(lease.holds(t0 + 1h));
  EXPECT_EQ(lease.held(t0 + 1500ms), 1500ms);
  lease.begin(t0 + 1h);  // the next step
  EXPECT_TRUE(lease.holds(t0 + 1h + 10ms));
}

TEST(FencingLease, ItsLengthIsTheConfiguredOneOrHalfTheDeadline) {
  EXPECT_EQ(FencingLease::length_for(0ms, 5000ms), 2500ms);
  EXPECT_EQ(FencingLease::length_for(800ms, 5000ms), 800ms);
}

}  // namespace
}  // namespace moed::comm
