// MOED_FAULT parsing: each kind, and every malformed value is a Usage error.
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
                                           MigrateCase{"migrate-kill:rank=12", Fault::Kind::MigrateKill, 12}));

class BadFaults : public ::testing::TestWithParam<const char*> {};
TEST_P(BadFaults, AreUsageErrorsThatQuoteTheValue) {
  const std::string text = GetParam();
  test::expect_error([&] { parse_fault(text); }, ErrorKind::Usage, {"MOED_FAULT", text});
}
INSTANTIATE_TEST_SUITE_P(Malformed, BadFaults,
                         ::testing::Values("sometimes", "stall:rank=1", "stall:rank=x,step=2", "migrate-fail",
                                           "migrate-explode:rank=1", "migrate-fail:rank=1,step=2",
                                           "stall:rank=99999999999,step=1"));

TEST(FaultInjection, MaybeInjectIgnoresOtherRanksStepsAndKinds) {
  // A stall that matched would sleep forever: these must all return.
  maybe_inject(parse_fault("stall:rank=1,step=5"), 0, 5);
  maybe_inject(parse_fault("stall:rank=1,step=5"), 1, 4);
  maybe_inject(parse_fault("migrate-kill:rank=1"), 1, 0);
  maybe_inject(std::nullopt, 0, 0);
  SUCCEED();
}

}  // namespace
}  // namespace moed::runtime
