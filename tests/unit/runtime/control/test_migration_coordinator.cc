// The migration coordinator's state machine, driven directly: every
// transition, abort and refusal, with the ranks' reports simulated.
#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <vector>

#include "common/error.h"
#include "placement/placement.h"
#include "placement/placement_diff.h"
#include "runtime/admin/protocol.h"
#include "runtime/control/control_messages.h"
#include "runtime/control/migration_coordinator.h"
#include "tests/unit/test_support.h"

namespace moed::runtime {
namespace {

using K = ControlAction::Kind;
using S = MigrationState;
constexpr int kRanks = 4;
constexpr std::size_t kSlotBytes = 1000;
// A slot of kSlotBytes whose shards carry their share.
std::size_t slot_bytes(int shards) { return kSlotBytes / std::size_t(shards); }

placement::Placement four_ranks() { return placement::contiguous(kRanks, 2, 8); }  // expert e on rank e / 2

std::vector<K> kinds(const std::vector<ControlAction>& actions) {
  std::vector<K> out;
  for (const auto& a : actions) out.push_back(a.kind);
  return out;
}

// What can go wrong on the ranks during a migration.
struct Faults {
  bool refuse = false;         // a destination refuses at prepare
  bool fail_send = false;      // a source fails during transfer
  bool corrupt = false;        // a destination's checksum differs at verify
  std::size_t chunk = 1 << 30;  // bytes a source sends per transfer boundary
};

// The ranks' side, simulated: turns one boundary's actions into the reports
// every rank would send (only when the actions ask for reports).
class FakeRanks {
 public:
  explicit FakeRanks(Faults faults) : faults_(faults) {}
  std::vector<StageReport> apply(const std::vector<ControlAction>& actions) {
    bool report = false;
    for (const auto& a : actions) {
      if (a.kind == K::prepare) {
        moves_ = a.moves;
        sent_ = 0;
        report = true;
      } else if (a.kind == K::transfer) {
        sent_ = std::min(total(), sent_ + faults_.chunk);
        report = true;
      } else if (a.kind == K::verify) {
        verified_ = a.expected;
        report = true;
      }
    }
    if (!report) return {};
    std::vector<StageReport> reports(kRanks);
    const auto& last = actions.back();
    reports[0].sent_bytes = sent_;  // rank 0 is the only source here
    reports[0].send_seconds = last.kind == K::transfer ? 0.5 : 0;
    if (sent_ == total())
      for (std::size_t i = 0; i < moves_.size(); ++i) reports[0].checksums.emplace_back(i, 100 + i);
    if (last.kind == K::prepare && faults_.refuse) reports[2].refused = "rank 2: 1 MB over [migration].memory_mb";
    if (last.kind == K::transfer && faults_.fail_send) reports[0].failed = "rank 0: put failed";
    if (last.kind == K::verify && faults_.corrupt) reports[3].bad_moves = {0};
    return reports;
  }

 private:
  // What the sources send: not releases, nor a shard a holder cuts in place.
  std::size_t total() const {
    std::size_t bytes = 0;
    for (const auto& m : moves_) bytes += m.to >= 0 && m.to != m.from ? slot_bytes(m.shards) : 0;
    return bytes;
  }
  Faults faults_;
  std::vector<placement::Move> moves_;
  std::vector<std::uint64_t> verified_;
  std::size_t sent_ = 0;
};

// One boundary: the requests (a callback issuing them), then the actions.
std::vector<ControlAction> boundary(MigrationCoordinator& c, FakeRanks& ranks, std::uint64_t epoch = 0,
                                    const std::function<void()>& requests = {}) {
  c.begin_boundary();
  if (requests) requests();
  std::vector<ControlAction> actions = c.end_boundary(epoch);
  if (std::vector<StageReport> reports = ranks.apply(actions); !reports.empty()) c.absorb(reports);
  return actions;
}

// Runs boundaries until the migration ends (or 50 boundaries), recording the kinds.
std::vector<K> run_to_end(MigrationCoordinator& c, FakeRanks& ranks) {
  std::vector<K> all;
  for (int i = 0; i < 50 && c.migration() && c.migration()->active(); ++i)
    for (K k : kinds(boundary(c, ranks))) all.push_back(k);
  return all;
}

TEST(MigrationCoordinator, NamesEveryStateAndKind) {
  for (S s : {S::prepare, S::transfer, S::verify, S::commit, S::release, S::committed, S::aborted})
    EXPECT_NE(state_name(s), "?");
  for (K k : {K::gather_stats, K::prepare, K::transfer, K::verify, K::commit, K::release, K::abort})
    EXPECT_NE(kind_name(k), "?");
}

// A migration takes one transfer boundary per chunk, then verify, commit, release.
class TransferChunks : public ::testing::TestWithParam<int> {};

TEST_P(TransferChunks, CommitsAfterEveryByteIsSent) {
  const int chunks = GetParam();
  MigrationCoordinator c(slot_bytes, true);
  FakeRanks ranks({.chunk = (kSlotBytes + chunks - 1) / chunks});
  const auto p = four_ranks();
  std::vector<ControlAction> first = boundary(c, ranks, 0, [&] { EXPECT_TRUE(c.migrate(p, 1, 3, 0, {}).ok()); });
  ASSERT_EQ(kinds(first), std::vector<K>{K::prepare});  // it waits for the prepare reports
  EXPECT_EQ(first[0].moves, (std::vector<placement::Move>{{1, 3, 1, 0, 1}}));  // from its first holder
  EXPECT_EQ(c.migration()->state, S::prepare);
  EXPECT_EQ(c.migration()->bytes, kSlotBytes);

  std::vector<K> expected(chunks, K::transfer);
  expected.insert(expected.end(), {K::verify, K::commit, K::release});
  EXPECT_EQ(run_to_end(c, ranks), expected);
  EXPECT_EQ(c.migration()->state, S::committed);
  EXPECT_EQ(c.migration()->done, kSlotBytes);
  EXPECT_DOUBLE_EQ(c.migration()->transfer_seconds, 0.5 * chunks);
  EXPECT_EQ(c.migration()->expected, std::vector<std::uint64_t>{100});
  EXPECT_FALSE(c.busy());
}
INSTANTIATE_TEST_SUITE_P(Chunks, TransferChunks, ::testing::Values(1, 2, 3, 7));

TEST(MigrationCoordinator, VerifyCarriesTheSourceChecksumsAndCommitTheNextEpoch) {
  MigrationCoordinator c(slot_bytes, true);
  FakeRanks ranks({});
  const auto p = four_ranks();
  boundary(c, ranks, 5, [&] { c.migrate(p, 0, 0, 3, {}); });
  boundary(c, ranks, 5);  // transfer
  const auto verify = boundary(c, ranks, 5);
  ASSERT_EQ(kinds(verify), std::vector<K>{K::verify});
  EXPECT_EQ(verify[0].expected, std::vector<std::uint64_t>{100});
  const auto commit = boundary(c, ranks, 5);
  ASSERT_EQ(kinds(commit), std::vector<K>{K::commit});
  EXPECT_EQ(commit[0].epoch, 6u);
  EXPECT_EQ(commit[0].migration, c.migration()->id);
}

// What must survive the switch (the committed placement file) is written
// before the commit is decided; when it cannot be, no rank switches.
TEST(MigrationCoordinator, ACommittedFileThatCannotBeWrittenAbortsBeforeTheSwitch) {
  for (const bool writable : {true, false}) {
    MigrationCoordinator c(slot_bytes, true);
    std::vector<std::uint64_t> epochs;
    c.set_before_commit([&](const MigrationRecord& m, std::uint64_t epoch) -> std::optional<std::string> {
      EXPECT_EQ(m.state, S::verify);
      epochs.push_back(epoch);
      if (writable) return std::nullopt;
      return std::string("[placement].committed /ro/p.toml cannot be written: Read-only file system");
    });
    FakeRanks ranks({});
    const auto p = four_ranks();
    boundary(c, ranks, 4, [&] { c.migrate(p, 1, 3, 0, {}); });
    std::vector<K> seen;
    for (int i = 0; i < 10 && c.migration()->active(); ++i)
      for (K k : kinds(boundary(c, ranks, 4))) seen.push_back(k);
    EXPECT_EQ(epochs, std::vector<std::uint64_t>{5});  // asked once, for the epoch it would commit
    if (writable) {
      EXPECT_EQ(c.migration()->state, S::committed);
    } else {
      EXPECT_EQ(c.migration()->state, S::aborted);
      EXPECT_EQ(std::count(seen.begin(), seen.end(), K::commit), 0);
      EXPECT_EQ(c.migration()->error,
                "before the switch: [placement].committed /ro/p.toml cannot be written: Read-only file system");
    }
  }
}

struct AbortCase {
  std::string name;
  Faults faults;
  S aborted_in;            // the state it was in when it aborted
  std::string error_head;  // how its error begins
};

class Aborts : public ::testing::TestWithParam<AbortCase> {};

TEST_P(Aborts, EndBeforeCommitAndSayWhy) {
  const AbortCase& t = GetParam();
  MigrationCoordinator c(slot_bytes, true);
  FakeRanks ranks(t.faults);
  const auto p = four_ranks();
  boundary(c, ranks, 0, [&] { c.migrate(p, 1, 3, 0, {}); });
  S before = c.migration()->state;
  std::vector<K> seen;
  while (c.migration()->active()) {
    before = c.migration()->state;
    for (K k : kinds(boundary(c, ranks))) seen.push_back(k);
  }
  EXPECT_EQ(c.migration()->state, S::aborted);
  EXPECT_EQ(before, t.aborted_in);
  EXPECT_EQ(c.migration()->error.rfind(t.error_head, 0), 0u) << c.migration()->error;
  ASSERT_FALSE(seen.empty());
  EXPECT_EQ(seen.back(), K::abort);
  EXPECT_EQ(std::count(seen.begin(), seen.end(), K::commit), 0);
  // The next request is served again.
  c.begin_boundary();
  EXPECT_TRUE(c.migrate(p, 1, 3, 0, {}).ok());
}
INSTANTIATE_TEST_SUITE_P(
    Faults, Aborts,
    ::testing::Values(AbortCase{"refused", {.refuse = true}, S::prepare, "refused: rank 2"},
                      AbortCase{"send_fails", {.fail_send = true}, S::transfer, "transfer failed: rank 0"},
                      AbortCase{"send_fails_midway", {.fail_send = true, .chunk = 300}, S::transfer,
                                "transfer failed"},
                      AbortCase{"checksum", {.corrupt = true}, S::verify,
                                "checksum mismatch: layer 1 expert 3 on rank 3"}),
    [](const auto& info) { return info.param.name; });

// A shard of a split expert moves whole from the rank named, at 1/S of the
// bytes, and only inside the shards' island.
TEST(MigrateAShard, FromItsHolderWithinItsIsland) {
  auto p = four_ranks();
  p.set_shards(1, 3, {0, 1});
  const placement::Topology islands({0, 0, 1, 1}), one_island({0, 0, 0, 0});
  MigrationCoordinator c(slot_bytes, true);
  c.begin_boundary();
  const Verdict across = c.migrate(p, 1, 3, 2, 1, &islands);
  EXPECT_EQ(across.code, admin::code::kRefused);
  EXPECT_NE(across.message.find("island 0; rank 2 is on island 1"), std::string::npos) << across.message;
  EXPECT_EQ(c.migrate(p, 1, 3, 0, 1, &islands).code, admin::code::kRefused) << "rank 0 holds shard 0";
  ASSERT_TRUE(c.migrate(p, 1, 3, 2, 1, &one_island).ok());
  EXPECT_EQ(c.migration()->moves, (std::vector<placement::Move>{{1, 3, 1, 2, 1, 1, 2}}));
  EXPECT_EQ(c.migration()->bytes, kSlotBytes / 2);
}

// A split expert held in two copies: a shard of the second copy moves within
// that copy's island, and the move names its copy.
TEST(MigrateAShard, OfItsCopyWithinThatCopysIsland) {
  auto p = placement::contiguous(6, 2, 6);
  p.set_shards(1, 3, {0, 1, 3, 4}, 2);
  const placement::Topology islands({0, 0, 0, 1, 1, 1});
  MigrationCoordinator c(slot_bytes, true);
  c.begin_boundary();
  const Verdict across = c.migrate(p, 1, 3, 2, 4, &islands);
  EXPECT_EQ(across.code, admin::code::kRefused);
  EXPECT_NE(across.message.find("rank 4's on island 1; rank 2 is on island 0"), std::string::npos) << across.message;
  ASSERT_TRUE(c.migrate(p, 1, 3, 5, 4, &islands).ok());
  EXPECT_EQ(c.migration()->moves, (std::vector<placement::Move>{{1, 3, 4, 5, 4, 1, 2, false, 1}}));
  EXPECT_EQ(placement::apply_moves(p, c.migration()->moves).replicas(1, 3), (std::vector<int>{0, 1, 3, 5}));
}

// A shutdown aborts a migration before commit; from commit on, it finishes.
class ShutdownDuring : public ::testing::TestWithParam<std::pair<int, bool>> {};

TEST_P(ShutdownDuring, AbortsBeforeCommitFinishesAfter) {
  const auto [boundaries_before, finishes] = GetParam();
  MigrationCoordinator c(slot_bytes, true);
  FakeRanks ranks({});
  const auto p = four_ranks();
  boundary(c, ranks, 0, [&] { c.migrate(p, 1, 3, 0, {}); });
  for (int i = 0; i < boundaries_before; ++i) boundary(c, ranks);
  boundary(c, ranks, 0, [&] { EXPECT_TRUE(c.shutdown().ok()); });
  run_to_end(c, ranks);
  EXPECT_EQ(c.migration()->state, finishes ? S::committed : S::aborted);
  EXPECT_EQ(c.migration()->error, finishes ? "" : "the daemon is shutting down");
  EXPECT_TRUE(c.stop());
}
// Boundaries after prepare: 0 -> in prepare, 1 -> transfer, 2 -> verify, 3 -> commit, 4 -> release.
INSTANTIATE_TEST_SUITE_P(Stages, ShutdownDuring,
                         ::testing::Values(std::pair{0, false}, std::pair{1, false}, std::pair{2, false},
                                           std::pair{3, true}, std::pair{4, true}));

// Elastic serving: the coordinator ends the migration a loss cut short as
// the survivors settled it, and gives up a plan being made.
class AfterALoss : public ::testing::TestWithParam<int> {};  // boundaries after prepare
TEST_P(AfterALoss, TheMigrationEndsAsTheSurvivorsSettledIt) {
  for (const bool committed : {false, true}) {
    MigrationCoordinator c(slot_bytes, true);
    FakeRanks ranks({});
    const auto p = four_ranks();
    boundary(c, ranks, 0, [&] { c.migrate(p, 1, 3, 0, {}); });
    for (int i = 0; i < GetParam(); ++i) boundary(c, ranks);
    const MigrationRecord running = *c.migration();
    c.after_loss(MigrationCoordinator::Settled{running.id, running.moves, committed}, running.id, "world rank(s) 2 lost");
    EXPECT_EQ(c.migration()->state, committed ? S::committed : S::aborted);
    if (!committed) {
      EXPECT_NE(c.migration()->error.find("world rank(s) 2 lost: rolled back"), std::string::npos);
    }
    EXPECT_FALSE(c.busy());
    EXPECT_TRUE(c.end_boundary(0).empty()) << "a settled migration sends no more actions";
  }
}
INSTANTIATE_TEST_SUITE_P(Stages, AfterALoss, ::testing::Values(0, 1, 2, 3));

TEST(MigrationCoordinator, AfterALossOfItsCoordinatorTheRecordIsRebuiltAndIdsGoOn) {
  MigrationCoordinator c(slot_bytes, true);
  const std::vector<placement::Move> moves{{1, 3, 1, 0, 1}};
  c.after_loss(MigrationCoordinator::Settled{7, moves, true}, 7, "world rank(s) 0 lost");
  ASSERT_NE(c.migration(), nullptr);
  EXPECT_EQ(c.migration()->id, 7u);
  EXPECT_EQ(c.migration()->state, S::committed);
  EXPECT_EQ(c.migration()->bytes, kSlotBytes);
  FakeRanks ranks({});
  boundary(c, ranks, 1, [&] { EXPECT_TRUE(c.migrate(four_ranks(), 0, 0, 3, {}).ok()); });
  EXPECT_EQ(c.migration()->id, 8u) << "a new coordinator never reuses a migration id";
}

TEST(MigrationCoordinator, ALossWhilePlanningGivesThePlanUp) {
  MigrationCoordinator c(slot_bytes, true);
  c.begin_boundary();
  ASSERT_TRUE(c.reoptimize().ok());
  ASSERT_TRUE(c.busy());
  c.after_loss(std::nullopt, 0, "world rank(s) 1 lost");
  EXPECT_FALSE(c.busy());
  EXPECT_EQ(c.migration(), nullptr);
}

// What each request gets in each situation.
enum class Situation { idle, migrating, planning, stopping, draining, no_stats };
enum class Ask { migrate, migrate_bad_layer, migrate_negative, migrate_holder, migrate_bad_from, reoptimize, unknown };

struct RefusalCase {
  Situation situation;
  Ask ask;
  std::string_view code;  // empty: accepted
};

class Requests : public ::testing::TestWithParam<RefusalCase> {};

TEST_P(Requests, AreAcceptedOrRefusedWithTheirCode) {
  const RefusalCase& t = GetParam();
  MigrationCoordinator c(slot_bytes, t.situation != Situation::no_stats);
  FakeRanks ranks({});
  const auto p = four_ranks();
  boundary(c, ranks, 0, [&] {
    if (t.situation == Situation::migrating) c.migrate(p, 0, 0, 3, {});
    if (t.situation == Situation::planning) c.reoptimize();
    if (t.situation == Situation::stopping) c.shutdown();
    if (t.situation == Situation::draining) c.drain();
  });
  c.begin_boundary();
  Verdict v;
  switch (t.ask) {
    case Ask::migrate: v = c.migrate(p, 1, 3, 0, {}); break;
    case Ask::migrate_bad_layer: v = c.migrate(p, 2, 0, 0, {}); break;
    case Ask::migrate_negative: v = c.migrate(p, 0, -1, 0, {}); break;
    case Ask::migrate_holder: v = c.migrate(p, 1, 3, 1, {}); break;
    case Ask::migrate_bad_from: v = c.migrate(p, 1, 3, 0, 2); break;
    case Ask::reoptimize: v = c.reoptimize(); break;
    case Ask::unknown: v = c.unknown_command("frobnicate"); break;
  }
  EXPECT_EQ(v.code, t.code) << v.message;
  EXPECT_EQ(v.ok(), v.message.empty()) << v.message;
}
INSTANTIATE_TEST_SUITE_P(
    Table, Requests,
    ::testing::Values(RefusalCase{Situation::idle, Ask::migrate, ""},
                      RefusalCase{Situation::idle, Ask::migrate_bad_layer, admin::code::kBadParams},
                      RefusalCase{Situation::idle, Ask::migrate_negative, admin::code::kBadParams},
                      RefusalCase{Situation::idle, Ask::migrate_holder, admin::code::kRefused},
                      RefusalCase{Situation::idle, Ask::migrate_bad_from, admin::code::kBadParams},
                      RefusalCase{Situation::idle, Ask::reoptimize, ""},
                      RefusalCase{Situation::idle, Ask::unknown, admin::code::kInternal},
                      RefusalCase{Situation::no_stats, Ask::reoptimize, admin::code::kRefused},
                      RefusalCase{Situation::migrating, Ask::migrate, admin::code::kBusy},
                      RefusalCase{Situation::migrating, Ask::reoptimize, admin::code::kBusy},
                      RefusalCase{Situation::migrating, Ask::migrate_bad_layer, admin::code::kBusy},
                      RefusalCase{Situation::planning, Ask::migrate, admin::code::kBusy},
                      RefusalCase{Situation::planning, Ask::reoptimize, admin::code::kBusy},
                      RefusalCase{Situation::stopping, Ask::migrate, admin::code::kShuttingDown},
                      RefusalCase{Situation::stopping, Ask::reoptimize, admin::code::kShuttingDown},
                      RefusalCase{Situation::draining, Ask::migrate, admin::code::kShuttingDown},
                      RefusalCase{Situation::draining, Ask::unknown, admin::code::kShuttingDown}));

TEST(MigrationCoordinator, BusyMessageNamesTheRunningMigrationAndItsState) {
  MigrationCoordinator c(slot_bytes, true);
  FakeRanks ranks({});
  const auto p = four_ranks();
  boundary(c, ranks, 0, [&] { c.migrate(p, 0, 0, 3, {}); });
  boundary(c, ranks);  // now transferring
  c.begin_boundary();
  EXPECT_EQ(c.migrate(p, 1, 3, 0, {}).message, "migration 1 is running (transfer)");
}

TEST(MigrationCoordinator, ASecondRequestInTheSameBoundaryIsBusy) {
  MigrationCoordinator c(slot_bytes, true);
  const auto p = four_ranks();
  c.begin_boundary();
  EXPECT_TRUE(c.migrate(p, 0, 0, 3, {}).ok());
  EXPECT_EQ(c.migrate(p, 1, 3, 0, {}).code, admin::code::kBusy);
  EXPECT_EQ(c.reoptimize().code, admin::code::kBusy);
  EXPECT_TRUE(c.shutdown().ok());  // shutdown and drain are always taken
  // The new migration waits for its prepare reports; the shutdown aborts it at the next boundary.
  EXPECT_EQ(kinds(c.end_boundary(0)), std::vector<K>{K::prepare});
  c.begin_boundary();
  EXPECT_EQ(kinds(c.end_boundary(0)), std::vector<K>{K::abort});
  EXPECT_TRUE(c.stop());
}

TEST(MigrationCoordinator, ReoptimizeGathersPlansThenMigrates) {
  MigrationCoordinator c(slot_bytes, true);
  FakeRanks ranks({});
  std::vector<ControlAction> gather;
  gather = boundary(c, ranks, 0, [&] { EXPECT_TRUE(c.reoptimize().ok()); });
  EXPECT_EQ(kinds(gather), std::vector<K>{K::gather_stats});
  EXPECT_TRUE(c.planning());
  EXPECT_TRUE(c.busy());
  EXPECT_TRUE(boundary(c, ranks).empty());  // the plan is being made
  std::vector<ControlAction> started = boundary(c, ranks, 0, [&] {
    EXPECT_TRUE(c.plan_ready({{0, 0, 0, 3, 0}, {1, 7, 3, 0, -1}}, false));
  });
  EXPECT_EQ(kinds(started), std::vector<K>{K::prepare});
  EXPECT_EQ(c.migration()->why, "reoptimize");
  EXPECT_EQ(c.migration()->bytes, 2 * kSlotBytes);
  EXPECT_FALSE(c.planning());
  run_to_end(c, ranks);
  EXPECT_EQ(c.migration()->state, S::committed);
}

// A plan that splits an expert: the bytes to send are the shard sent to
// another rank only (the holder keeps its shard, cut in place), and the
// migration commits once they are.
TEST(MigrationCoordinator, ASplitSendsOnlyTheShardsThatLeaveTheirHolder) {
  MigrationCoordinator c(slot_bytes, true);
  FakeRanks ranks({});
  boundary(c, ranks, 0, [&] { EXPECT_TRUE(c.reoptimize().ok()); });
  boundary(c, ranks);
  const std::vector<placement::Move> split{{1, 2, 1, 0, -1, 0, 2, true}, {1, 2, 1, 1, -1, 1, 2, true},
                                           {1, 2, -1, -1, 3, 0, 2, true}};
  boundary(c, ranks, 0, [&] { EXPECT_TRUE(c.plan_ready(split, false)); });
  EXPECT_EQ(c.migration()->bytes, kSlotBytes / 2);
  run_to_end(c, ranks);
  EXPECT_EQ(c.migration()->state, S::committed);
  EXPECT_EQ(c.migration()->done, kSlotBytes / 2);
}

// Rank 0 sends a prepare's moves to the other ranks: every field arrives,
// a shard's and a cut's included (a rank that missed `cut` would look for
// the shard it is to cut from its whole copy), and the copy a shard is of.
TEST(MigrationCoordinator, ThePreparedMovesReachTheRanksWhole) {
  BoundaryActions sent;
  ControlAction prepare;
  prepare.kind = K::prepare;
  prepare.migration = 4;
  prepare.moves = {{1, 2, 1, 0, -1, 0, 2, true}, {1, 2, -1, -1, 3, 0, 2, true}, {0, 5, 2, 3, 2, 1, 2, false},
                   {0, 6, 0, 1, 0}, {0, 7, 4, 5, 4, 1, 2, false, 1}, {1, 2, 6, 7, -1, 1, 2, true, 2}};
  sent.actions.push_back(prepare);
  const BoundaryActions received = decode_actions(encode_actions(sent));
  ASSERT_EQ(received.actions.size(), 1u);
  EXPECT_EQ(received.actions[0].moves, prepare.moves);
}

TEST(MigrationCoordinator, ADryRunOrAnEmptyPlanStartsNothing) {
  for (bool dry_run : {true, false}) {
    MigrationCoordinator c(slot_bytes, true);
    c.begin_boundary();
    c.reoptimize();
    c.end_boundary(0);
    c.begin_boundary();
    std::vector<placement::Move> moves;
    if (dry_run) moves.push_back({0, 0, 0, 3, 0});
    EXPECT_FALSE(c.plan_ready(moves, dry_run));
    EXPECT_TRUE(c.end_boundary(0).empty());
    EXPECT_EQ(c.migration(), nullptr);
    EXPECT_FALSE(c.busy());
  }
}

TEST(MigrationCoordinator, AFailedPlanFreesTheCoordinator) {
  MigrationCoordinator c(slot_bytes, true);
  c.begin_boundary();
  c.reoptimize();
  c.end_boundary(0);
  c.plan_failed();
  EXPECT_FALSE(c.busy());
  // Busy for the rest of the boundary in which the plan ended: its ranks have not seen the end yet.
  c.begin_boundary();
  EXPECT_TRUE(c.reoptimize().ok());
}

TEST(MigrationCoordinator, DrainStopsOnlyWhenTheMigrationHasEnded) {
  MigrationCoordinator c(slot_bytes, true);
  FakeRanks ranks({});
  const auto p = four_ranks();
  boundary(c, ranks, 0, [&] { c.migrate(p, 0, 0, 3, {}); });
  boundary(c, ranks, 0, [&] { EXPECT_TRUE(c.drain().ok()); });
  EXPECT_FALSE(c.stop());
  run_to_end(c, ranks);
  EXPECT_EQ(c.migration()->state, S::committed);  // a drain lets it finish
  EXPECT_TRUE(c.stop());
}

TEST(MigrationCoordinator, StepTimesBeforeAndDuringAreKeptInBoundedMemory) {
  MigrationCoordinator c(slot_bytes, true);
  FakeRanks ranks({.chunk = 1});
  for (int i = 0; i < 1000; ++i) c.note_step(i < 744 ? 100.0 : 10.0);  // only the last 256 count
  const auto p = four_ranks();
  boundary(c, ranks, 0, [&] { c.migrate(p, 0, 0, 3, {}); });
  for (int i = 0; i < 500; ++i) c.note_step(20.0);
  const MigrationRecord& m = *c.migration();
  EXPECT_EQ(m.step_ms_before.count(), 256u);
  EXPECT_NEAR(m.step_ms_before.quantile(0.99), 10.0, 0.1);
  EXPECT_EQ(m.step_ms_during.count(), 500u);
  EXPECT_NEAR(m.step_ms_during.quantile(0.99), 20.0, 0.2);
}

TEST(ControlMessages, ActionsRoundTrip) {
  BoundaryActions b;
  b.stop = true;
  ControlAction prepare;
  prepare.kind = K::prepare;
  prepare.migration = 7;
  prepare.moves = {{1, 3, 1, 0, 1}, {0, 2, 0, 3, -1}, {1, 5, 2, 3, 2, 1, 4}};  // the last a shard
  ControlAction verify;
  verify.kind = K::verify;
  verify.migration = 7;
  verify.expected = {0xffffffffffffffffull, 3};
  ControlAction commit;
  commit.kind = K::commit;
  commit.migration = 7;
  commit.epoch = 12;
  ControlAction gather;
  gather.kind = K::gather_stats;
  b.actions = {gather, prepare, verify, commit};
  EXPECT_EQ(decode_actions(encode_actions(b)), b);
}

TEST(ControlMessages, NothingToDoIsEmptyText) {
  EXPECT_EQ(encode_actions({}), "");
  EXPECT_EQ(decode_actions(""), BoundaryActions{});
  BoundaryActions stop;
  stop.stop = true;
  EXPECT_NE(encode_actions(stop), "");
}

TEST(ControlMessages, ReportsRoundTrip) {
  StageReport r;
  r.sent_bytes = 123456789012;
  r.send_seconds = 0.25;
  r.refused = "rank 2: over budget";
  r.failed = "rank 1: put failed";
  r.checksums = {{0, 42}, {3, 0xfedcba9876543210ull}};
  r.bad_moves = {1, 2};
  EXPECT_EQ(decode_report(encode_report(r)), r);
  EXPECT_EQ(decode_report(encode_report(StageReport{})), StageReport{});
}

TEST(ControlMessages, MalformedTextIsAnInternalErrorNamingIt) {
  for (const std::string bad : {"{", R"({"ops":[{"op":"teleport"}],"stop":false})", R"({"ops":[]})", "[1]"}) {
    try {
      decode_actions(bad);
      ADD_FAILURE() << bad;
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::Internal) << bad;
    }
  }
  EXPECT_THROW(decode_report(R"({"sent":"many"})"), Error);
}

// A joiner's worker address (binary) travels in the boundary's JSON as hex.
TEST(ControlMessages, AJoinersAddressTravelsWithTheBoundaryActions) {
  BoundaryActions a;
  a.arrivals.push_back({5, "node7", {std::byte{0}, std::byte{0xff}, std::byte{0x3c}}});
  EXPECT_EQ(decode_actions(encode_actions(a)), a);
  test::expect_error([] { decode_actions(R"({"ops":[],"stop":false,"arrivals":[{"rank":5,"host":"x","address":"zz"}]})"); },
                     ErrorKind::Runtime, {"a joiner's address", "not lowercase hex"});
}

}  // namespace
}  // namespace moed::runtime
