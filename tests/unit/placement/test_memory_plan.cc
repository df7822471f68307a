// The model of memory, line by line against sizes worked out by hand: weight
// formats, slots and shards, migration, statistics (cross-checked against
// routing's own count), memory sizes as flags, and the fewest ranks.
#include "placement/memory_plan.h"

#include <gtest/gtest.h>

#include "routing/routing_stats.h"
#include "tests/unit/test_support.h"

namespace moed::placement {
namespace {

using test::expect_error;

std::uint64_t part(const MemoryEstimate& e, const std::string& starts) {
  for (const MemoryPart& p : e.parts)
    if (p.what.rfind(starts, 0) == 0) return p.bytes;
  ADD_FAILURE() << "no part " << starts;
  return 0;
}
bool has(const MemoryEstimate& e, const std::string& starts) {
  for (const MemoryPart& p : e.parts)
    if (p.what.rfind(starts, 0) == 0) return true;
  return false;
}

RankMemoryInputs small() {
  RankMemoryInputs in;
  in.layers = 3, in.experts = 8, in.hidden = 64, in.ffn = 96, in.max_k = 2;
  in.expert_format = weight_format("f32", "test");
  in.slots = {{12, 1}};
  in.tokens = 50;
  return in;
}

struct FormatCase {
  const char* name;
  std::uint64_t elements, bytes;
};
class Formats : public ::testing::TestWithParam<FormatCase> {};
TEST_P(Formats, BytesOfWholeBlocks) {
  EXPECT_EQ(weight_format(GetParam().name, "--dtype").bytes(GetParam().elements), GetParam().bytes);
}
INSTANTIATE_TEST_SUITE_P(All, Formats,
                         ::testing::Values(FormatCase{"f32", 10, 40}, FormatCase{"bf16", 10, 20},
                                           FormatCase{"f16", 3, 6}, FormatCase{"mxfp4", 64, 34},
                                           FormatCase{"mxfp4", 33, 34},  // a partial block takes a whole one
                                           FormatCase{"fp8", 16384, 16388}, FormatCase{"fp8", 0, 0}));

TEST(WeightFormat, UnknownIsAUsageErrorListingTheKnown) {
  expect_error([] { weight_format("int3", "--dtype"); }, ErrorKind::Usage,
               {"--dtype: unknown weight format \"int3\"", "f32, bf16, f16, fp8, mxfp4"});
}

TEST(MemoryPlan, SlotsInTheHeldFormat) {
  RankMemoryInputs in = small();
  EXPECT_EQ(part(rank_memory(in), "expert weights"), 12u * 3 * 64 * 96 * 4);
  in.pack_at_load = true;
  EXPECT_EQ(part(rank_memory(in), "expert weights"), 12u * 3 * 64 * 96 * 4);
  EXPECT_EQ(part(rank_memory(in), "packing at load"), 3u * 64 * 96 * 4);
  in.pack_at_load = false;
  in.expert_format = weight_format("bf16", "t");
  in.expert_bias = true;
  EXPECT_EQ(part(rank_memory(in), "expert weights"), 12u * (3 * 64 * 96 + 2 * 96 + 64) * 2);
}

TEST(MemoryPlan, ShardsHoldTheirShareOfTheFfn) {
  RankMemoryInputs in = small();
  in.slots = {{2, 1}, {4, 2}, {3, 5}};
  const MemoryEstimate e = rank_memory(in);
  EXPECT_EQ(part(e, "expert weights"), 2u * 3 * 64 * 96 * 4);
  EXPECT_EQ(part(e, "expert shards: 4 slots of 1/2"), 4u * 3 * 64 * 48 * 4);
  EXPECT_EQ(part(e, "expert shards: 3 slots of 1/5"), 3u * 3 * 64 * 20 * 4);  // ceil(96 / 5) = 20
  EXPECT_EQ(e.group_total("expert slots"), 2u * 3 * 64 * 96 * 4 + 4u * 3 * 64 * 48 * 4 + 3u * 3 * 64 * 20 * 4);
}

TEST(MemoryPlan, RouterOnTheGpuIsOneFp32Copy) {
  RankMemoryInputs in = small();
  in.cpu_router = false;
  EXPECT_EQ(part(rank_memory(in), "gates and norms"), 3u * 9 * 64 * 4);
}

TEST(MemoryPlan, MigrationWindowAndArrivals) {
  RankMemoryInputs in = small();
  EXPECT_FALSE(has(rank_memory(in), "migration"));
  in.migration_in = 2, in.migration_out = 1;
  const MemoryEstimate e = rank_memory(in);
  const std::uint64_t slot = 3u * 64 * 96 * 4;
  EXPECT_EQ(part(e, "migration window"), 3 * slot);
  EXPECT_EQ(part(e, "migration arrivals"), 2 * slot);
  EXPECT_EQ(e.group_total("migration"), 5 * slot);
  in.migration_in = 0;  // a source only stages what it sends
  EXPECT_EQ(rank_memory(in).group_total("migration"), slot);
}

TEST(MemoryPlan, PhasesOfARanksLife) {
  RankMemoryInputs in = small();
  in.pack_at_load = true, in.migration_in = 1, in.migration_out = 1;
  const MemoryEstimate e = rank_memory(in);
  const MemoryPhases p = phases(e);
  const std::uint64_t slot = 3u * 64 * 96 * 4, buffers = e.group_total("dispatch and combine");
  EXPECT_EQ(p.after_load, 13 * slot + e.group_total("router and norm"));  // the packing copy stays
  EXPECT_EQ(p.load_peak, p.after_load);
  EXPECT_EQ(p.serving, p.after_load + buffers);
  EXPECT_EQ(p.migrating, p.serving + 3 * slot);
  EXPECT_EQ(p.peak(), p.migrating);
  EXPECT_EQ(e.total(), p.migrating);
  in.maps_peer_windows = true;  // a source on one host maps what it writes
  EXPECT_EQ(phases(rank_memory(in)).migrating, p.migrating + slot);
}

TEST(MemoryPlan, StatisticsAsRoutingCountsThem) {
  // The aggregates are RoutingStats' values, 8 bytes each; the sample 4 bytes x L x (k + 1) per token.
  for (auto [L, E] : {std::pair{3, 8}, {58, 256}, {1, 1}}) {
    EXPECT_EQ(stats_bytes(L, E, 0, 2), 8 * routing::RoutingStats::value_count(L, E)) << L << "x" << E;
    EXPECT_EQ(stats_bytes(L, E, 100, 2) - stats_bytes(L, E, 0, 2), 100u * 4 * L * 3);
  }
  RankMemoryInputs in = small();
  EXPECT_EQ(rank_memory(in).group_total("statistics and traces"), 0u);
  in.stats = true, in.stats_sample_tokens = 10, in.gathered_sample_tokens = 40;
  EXPECT_EQ(rank_memory(in).group_total("statistics and traces"), 2 * stats_bytes(3, 8, 10, 2));
  in.gathers_stats = true;
  in.load_window_steps = 8;
  in.trace_tokens = 100;
  const MemoryEstimate e = rank_memory(in);
  EXPECT_EQ(part(e, "gathered statistics"), 2 * stats_bytes(3, 8, 40, 2));
  EXPECT_EQ(part(e, "expert load window"), 8u * 3 * 8 * 8);
  EXPECT_EQ(part(e, "replayed trace"), 100u * 3 * (2 * 8 + 8));
}

TEST(MemoryPlan, EveryPartInAKnownGroupAndTheTotalIsTheirSum) {
  RankMemoryInputs in = small();
  in.migration_in = 1, in.stats = true, in.process_bytes = 1000, in.process_what = "process";
  const MemoryEstimate e = rank_memory(in);
  std::uint64_t sum = 0, groups = 0;
  for (const MemoryPart& p : e.parts) {
    sum += p.bytes;
    EXPECT_NE(std::find(memory_groups().begin(), memory_groups().end(), p.group), memory_groups().end()) << p.group;
  }
  for (const std::string& g : memory_groups()) groups += e.group_total(g);
  EXPECT_EQ(e.total(), sum);
  EXPECT_EQ(groups, sum);
  EXPECT_EQ(part(e, "process"), 1000u);
}

TEST(MemoryPlan, SaturatesInsteadOfWrapping) {
  RankMemoryInputs in = small();
  in.hidden = 1 << 20, in.ffn = 1 << 22;
  in.slots = {{std::uint64_t(1) << 40, 1}};
  EXPECT_EQ(rank_memory(in).total(), std::numeric_limits<std::uint64_t>::max());
}

struct SizeCase {
  const char* text;
  std::uint64_t bytes;
};
class Sizes : public ::testing::TestWithParam<SizeCase> {};
TEST_P(Sizes, Parse) { EXPECT_EQ(parse_memory_size(GetParam().text, "--gpu-memory"), GetParam().bytes); }
INSTANTIATE_TEST_SUITE_P(All, Sizes,
                         ::testing::Values(SizeCase{"80", 80ull << 30}, SizeCase{"80GiB", 80ull << 30},
                                           SizeCase{"80G", 80ull << 30}, SizeCase{"141GB", 141000000000ull},
                                           SizeCase{"512MiB", 512ull << 20}, SizeCase{"1.5GiB", 3ull << 29},
                                           SizeCase{"2TB", 2000000000000ull}));

TEST(MemoryPlan, BadSizesAreUsageErrors) {
  for (const char* bad : {"", "GiB", "-1", "0", "80 GB", "eighty", "1e30", "80gb"})
    expect_error([&] { parse_memory_size(bad, "--gpu-memory"); }, ErrorKind::Usage, {"--gpu-memory", "80GiB"});
}

TEST(MemoryPlan, FewestRanksScansUpToTheLimit) {
  // Not monotone: 3 ranks need more than 2 here, so the scan cannot bisect.
  auto largest = [](int r) {
    MemoryEstimate e;
    e.parts.push_back({"x", "", std::uint64_t(r == 2 ? 50 : 300 / r), "process"});
    return e;
  };
  EXPECT_EQ(fewest_ranks(largest, 60, 10), 2);
  EXPECT_EQ(fewest_ranks(largest, 40, 10), 8);
  EXPECT_EQ(fewest_ranks(largest, 10, 10), std::nullopt);
}

}  // namespace
}  // namespace moed::placement

namespace moed::placement {
namespace {

// What a rank holds, grouped by shard count: a split expert's shard counts
// 1/S of its weights in the planner (and in the daemon's start-up check).
TEST(MemoryPlan, SlotGroupsCountShardsApart) {
  Placement p = contiguous(4, 2, 4);  // one whole expert per rank and layer
  p.set_shards(1, 2, {3, 0, 2, 1});   // layer 1's expert 2 in 4 shards
  const auto groups = [&](int rank) {
    std::vector<std::pair<std::uint64_t, std::uint64_t>> out;
    for (const SlotGroup& g : slot_groups(p, rank)) out.emplace_back(g.count, g.shards);
    return out;
  };
  using Groups = std::vector<std::pair<std::uint64_t, std::uint64_t>>;
  EXPECT_EQ(groups(0), (Groups{{2, 1}, {1, 4}}));
  EXPECT_EQ(groups(2), (Groups{{1, 1}, {1, 4}}));  // its whole expert 2 became a shard
  EXPECT_EQ(groups(3), (Groups{{2, 1}, {1, 4}}));
  EXPECT_EQ(slot_groups(contiguous(2, 3, 4), 1).size(), 1u);
  EXPECT_EQ(slot_groups(contiguous(2, 3, 4), 1)[0].count, 6u);
}

}  // namespace
}  // namespace moed::placement
