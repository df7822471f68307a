// MOED_FAULT parsing: each kind, and every malformed value is a Usage error;
// which (rank, step) each fault applies to.
#include "runtime/control/fault_injection.h"

#include "tests/unit/test_support.h"

namespace moed::runtime {
namespace {

TEST(FaultInjection, EmptyMeansNoFault) { EXPECT_FALSE(parse_fault("").has_value()); }

TEST(FaultInjection, StallNamesRankAndStep) {
  const auto f = parse_fault("stall:rank=3,step=17");
  ASSERT_TRUE(f.has_value());
  EXPECT_EQ(f->kind, Fault::Kind::Stall);
  EXPECT_EQ(f->rank, 3);
  EXPECT_EQ(f->step, 17u);
}

TEST(FaultInjection, PauseNamesRankStepAndLength) {
  const auto f = parse_fault("pause:rank=2,step=5,ms=2500");
  ASSERT_TRUE(f.has_value());
  EXPECT_EQ(f->kind, Fault::Kind::Pause);
  EXPECT_EQ(f->rank, 2);
  EXPECT_EQ(f->step, 5u);
  EXPECT_EQ(f->ms, 2500u);
}

struct MigrateCase {
  const char* text;
  Fault::Kind kind;
  int rank;
};
class MigrateFaults : public ::testing::TestWithParam<MigrateCase> {};

TEST_P(MigrateFaults, ParseToTheirKindAndRank) {
  const auto f = parse_fault(GetParam().text);
  ASSERT_TRUE(f.has_value());
  EXPECT_EQ(f->kind, GetParam().kind);
  EXPECT_EQ(f->rank, GetParam().rank);
}
INSTANTIATE_TEST_SUITE_P(Kinds, MigrateFaults,
                         ::testing::Values(MigrateCase{"migrate-fail:rank=1", Fault::Kind::MigrateFail, 1},
                                           MigrateCase{"migrate-corrupt:rank=0", Fault::Kind::MigrateCorrupt, 0},
                                           MigrateCase{"migrate-kill:rank=12", Fault::Kind::MigrateKill, 12},
                                           MigrateCase{"migrate-hold:rank=2", Fault::Kind::MigrateHold, 2},
                                           MigrateCase{"migrate-commit-kill:rank=0", Fault::Kind::MigrateCommitKill,
                                                       0}));

class BadFaults : public ::testing::TestWithParam<const char*> {};
TEST_P(BadFaults, AreUsageErrorsThatQuoteTheValue) {
  const std::string text = GetParam();
  test::expect_error([&] { parse_fault(text); }, ErrorKind::Usage, {"MOED_FAULT", text});
}
INSTANTIATE_TEST_SUITE_P(Malformed, BadFaults,
                         ::testing::Values("sometimes", "stall:rank=1", "stall:rank=x,step=2", "migrate-fail",
                                           "migrate-explode:rank=1", "migrate-fail:rank=1,step=2",
                                           "migrate-hold:rank=-1", "stall:rank=99999999999,step=1",
                                           "pause:rank=1,step=2", "pause:rank=1,ms=5", "pause:rank=1,step=2,ms=x"));

// fault_applies is maybe_inject's whole decision (a stall that applies sleeps
// until the job is aborted), and the rule the migration hooks follow.
struct ApplyCase {
  const char* name;
  const char* fault;  // MOED_FAULT; "" for none
  int rank;
  std::uint64_t step;
  Fault::Kind kind;
  bool applies;
};
class FaultApplies : public ::testing::TestWithParam<ApplyCase> {};

TEST_P(FaultApplies, OnlyToItsKindRankAndStallStep) {
  const ApplyCase& c = GetParam();
  EXPECT_EQ(fault_applies(parse_fault(c.fault), c.rank, c.step, c.kind), c.applies);
}
INSTANTIATE_TEST_SUITE_P(
    Cases, FaultApplies,
    ::testing::Values(
        ApplyCase{"StallAtItsRankAndStep", "stall:rank=1,step=5", 1, 5, Fault::Kind::Stall, true},
        ApplyCase{"StallOnAnotherRank", "stall:rank=1,step=5", 0, 5, Fault::Kind::Stall, false},
        ApplyCase{"StallTheStepBefore", "stall:rank=1,step=5", 1, 4, Fault::Kind::Stall, false},
        ApplyCase{"StallTheStepAfter", "stall:rank=1,step=5", 1, 6, Fault::Kind::Stall, false},
        ApplyCase{"StallAskedAsAnotherKind", "stall:rank=1,step=5", 1, 5, Fault::Kind::MigrateKill, false},
        ApplyCase{"PauseAtItsRankAndStep", "pause:rank=1,step=5,ms=9", 1, 5, Fault::Kind::Pause, true},
        ApplyCase{"PauseTheStepAfter", "pause:rank=1,step=5,ms=9", 1, 6, Fault::Kind::Pause, false},
        ApplyCase{"PauseAskedAsAStall", "pause:rank=1,step=5,ms=9", 1, 5, Fault::Kind::Stall, false},
        ApplyCase{"MigrationFaultIsNoStall", "migrate-kill:rank=1", 1, 0, Fault::Kind::Stall, false},
        ApplyCase{"MigrationFaultAtAnyStep", "migrate-kill:rank=1", 1, 123, Fault::Kind::MigrateKill, true},
        ApplyCase{"MigrationFaultOnAnotherRank", "migrate-kill:rank=1", 2, 0, Fault::Kind::MigrateKill, false},
        ApplyCase{"HoldAtItsRank", "migrate-hold:rank=2", 2, 7, Fault::Kind::MigrateHold, true},
        ApplyCase{"HoldIsNoFailure", "migrate-hold:rank=2", 2, 7, Fault::Kind::MigrateFail, false},
        ApplyCase{"NoFaultNever", "", 0, 0, Fault::Kind::Stall, false}),
    [](const auto& info) { return std::string(info.param.name); });

}  // namespace
}  // namespace moed::runtime
