// Which expert rows a rank computes (runtime/engine/chunk_schedule.h), from
// the all-gathered counts alone: whole chunks naming their rows per home, or
// chunks cut at home boundaries, and the pairs each home sends each rank.
#include "runtime/engine/chunk_schedule.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <tuple>
#include <vector>

#include "placement/placement.h"
#include "runtime/engine/dispatch_plan.h"
#include "runtime/router/router.h"
#include "tests/unit/runtime/engine/plan_test_support.h"

namespace moed::runtime {
namespace {

using placement::Placement;

// ---------------------------------------------------------------- chunk schedule

// Expert 0 has replicas on ranks 0 and 1, chunks of 2 rows. Rank 0 has 3 of its rows
// (positions 0-2), rank 1 has 2 (positions 3-4). Step 0, no topology: chunk j goes to
// replica j mod 2, so chunks 0 ([0, 2)) and 2 ([4, 5)) are rank 0's, chunk 1 ([2, 4))
// rank 1's, whose rows come from both homes.
struct TwoReplicas : ::testing::Test {
  TwoReplicas() : p(2, 1, 2) {
    p.set_replicas(0, 0, {0, 1});
    p.set_replicas(0, 1, {1});
  }
  PlanInput as(int rank) const { return plan_input(none, p, c, rank, 2, 0); }
  Placement p;
  const ExpertCounts c = counts_of({{3, 1}, {2, 0}});
  const Routing none;
};

TEST_F(TwoReplicas, PairsToRanksFollowTheChunks) {
  EXPECT_EQ(pairs_to_ranks(as(0), 0), (std::vector<std::uint64_t>{2, 1 + 1}));  // e1 is on rank 1
  EXPECT_EQ(pairs_to_ranks(as(0), 1), (std::vector<std::uint64_t>{1, 1}));
}

TEST_F(TwoReplicas, WholeChunksNameTheirRowsPerHome) {
  const ChunkSchedule at0 = schedule_chunks(as(0), false);
  ASSERT_EQ(at0.experts, (std::vector<int>{0}));
  EXPECT_EQ(at0.rows_from, (std::vector<std::vector<std::uint32_t>>{{2, 1}}));
  ASSERT_EQ(at0.tasks.size(), 2u);
  EXPECT_EQ(at0.tasks[0].rows, 2u);
  ASSERT_EQ(at0.tasks[0].segments.size(), 1u);
  EXPECT_EQ((std::tuple{at0.tasks[0].segments[0].home, at0.tasks[0].segments[0].first,
                        at0.tasks[0].segments[0].rows}),
            (std::tuple{0, 0u, 2u}));
  ASSERT_EQ(at0.tasks[1].segments.size(), 1u);  // position 4: the first row rank 1 sends here
  EXPECT_EQ((std::tuple{at0.tasks[1].segments[0].home, at0.tasks[1].segments[0].first,
                        at0.tasks[1].segments[0].rows}),
            (std::tuple{1, 0u, 1u}));

  const ChunkSchedule at1 = schedule_chunks(as(1), false);
  ASSERT_EQ(at1.experts, (std::vector<int>{0, 1}));
  EXPECT_EQ(at1.rows_from, (std::vector<std::vector<std::uint32_t>>{{1, 1}, {1, 0}}));
  ASSERT_EQ(at1.tasks.size(), 2u);
  EXPECT_EQ(at1.tasks[0].rows, 2u);  // chunk 1: one row of each home, in one call
  ASSERT_EQ(at1.tasks[0].segments.size(), 2u);
  EXPECT_EQ(at1.tasks[0].segments[0].home, 0);
  EXPECT_EQ(at1.tasks[0].segments[1].home, 1);
  EXPECT_EQ(at1.tasks[1].slot, 1);
}

TEST_F(TwoReplicas, SplitByHomeCutsAChunkAtHomeBoundaries) {
  const ChunkSchedule at1 = schedule_chunks(as(1), true);
  ASSERT_EQ(at1.tasks.size(), 3u);
  for (const ExpertTask& t : at1.tasks) ASSERT_EQ(t.segments.size(), 1u);
  EXPECT_EQ((std::tuple{at1.tasks[0].slot, at1.tasks[0].segments[0].home, at1.tasks[0].rows}),
            (std::tuple{0, 0, 1u}));
  EXPECT_EQ((std::tuple{at1.tasks[1].slot, at1.tasks[1].segments[0].home, at1.tasks[1].rows}),
            (std::tuple{0, 1, 1u}));
  EXPECT_EQ(at1.tasks[2].slot, 1);
}

}  // namespace
}  // namespace moed::runtime
