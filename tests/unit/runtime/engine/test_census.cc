// The census of a layer (runtime/engine/census.h), over 2 ranks as threads
// on the in-memory fabric: each rank's blocks, per pass, come back to every
// rank as its counts per expert, its token count, its first key (all 64
// bits) and its trace slots, none unless written.
#include "runtime/engine/census.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "runtime/router/router.h"
#include "tests/unit/runtime/engine/plan_test_support.h"
#include "tests/unit/runtime/fake_fabric.h"

namespace moed::runtime {
namespace {

constexpr int kRanks = 2, kExperts = 3;
constexpr std::size_t kPasses = 2;

// Rank r's tokens: 3 on rank 0, 2 on rank 1; pass 0 takes the first token, pass 1 the rest.
Routing routing_of(int r) {
  return r == 0 ? make_routing({{{0, .5f}, {2, .5f}}, {{2, 1}}, {{1, .25f}, {2, .75f}}})
                : make_routing({{{1, 1}}, {{0, .5f}, {1, .5f}}});
}
std::uint64_t first_key_of(int r) { return (std::uint64_t(1) << 40) + 10 * std::uint64_t(r); }

TEST(LayerCensus, EveryRankReadsEveryRanksBlocks) {
  fake::Fabric fabric(3);
  std::vector<LayerCensus> census(kRanks, LayerCensus(kRanks, kPasses, kExperts));
  std::vector<std::thread> threads;
  for (int r = 0; r < kRanks; ++r)
    threads.emplace_back([&, r] {
      const std::unique_ptr<comm::Transport> transport = fabric.transport(r, kRanks);
      const Routing routing = routing_of(r);
      const std::size_t n = routing.tokens();
      census[r].write(0, routing, 0, 1, first_key_of(r));
      const std::span<std::uint32_t> slots = census[r].write(1, routing, 1, n - 1, first_key_of(r) + 1);
      ASSERT_EQ(slots.size(), kTraceSlots);
      if (r == 1) slots[0] = 0;  // rank 1 traces its pass-1 token at offset 0
      census[r].gather(*transport, "test census");
    });
  for (std::thread& t : threads) t.join();
  for (int reader = 0; reader < kRanks; ++reader) {
    SCOPED_TRACE("read on rank " + std::to_string(reader));
    const LayerCensus& c = census[reader];
    EXPECT_EQ(c.ranks(), kRanks);
    ExpertCounts counts(kRanks, kExperts);
    PassHomes homes;
    c.read(0, counts, homes);
    EXPECT_EQ(counts.at(0, 0), 1u);
    EXPECT_EQ(counts.at(0, 2), 1u);
    EXPECT_EQ(counts.at(1, 1), 1u);
    EXPECT_EQ(counts.total(0) + counts.total(1) + counts.total(2), 3u);
    EXPECT_EQ(homes.tokens, (std::vector<std::uint64_t>{1, 1}));
    EXPECT_EQ(homes.first_key, (std::vector<std::uint64_t>{first_key_of(0), first_key_of(1)}));
    c.read(1, counts, homes);
    EXPECT_EQ(counts.at(0, 1), 1u);
    EXPECT_EQ(counts.at(0, 2), 2u);
    EXPECT_EQ(counts.at(1, 0), 1u);
    EXPECT_EQ(counts.at(1, 1), 1u);
    EXPECT_EQ(homes.tokens, (std::vector<std::uint64_t>{2, 1}));
    EXPECT_EQ(homes.first_key, (std::vector<std::uint64_t>{first_key_of(0) + 1, first_key_of(1) + 1}));
    EXPECT_EQ(c.first_key(1, 1), first_key_of(1) + 1);
    for (int r = 0; r < kRanks; ++r)
      for (std::size_t m = 0; m < kPasses; ++m) {
        const std::span<const std::uint32_t> slots = c.trace_slots(r, m);
        ASSERT_EQ(slots.size(), kTraceSlots);
        for (std::size_t i = 0; i < kTraceSlots; ++i)
          EXPECT_EQ(slots[i], r == 1 && m == 1 && i == 0 ? 0u : kNoTrace) << "rank " << r << " pass " << m;
      }
  }
}

TEST(LayerCensus, AWriteReplacesThePassesBlockWhole) {
  LayerCensus c(1, 1, kExperts);
  const Routing routing = routing_of(0);
  c.write(0, routing, 0, 3, 5)[1] = 2;
  c.write(0, routing, 2, 1, 7);  // the next layer: counts, tokens, key and slots all new
  fake::Fabric fabric(4);
  c.gather(*fabric.transport(0, 1), "test census");
  ExpertCounts counts(1, kExperts);
  PassHomes homes;
  c.read(0, counts, homes);
  EXPECT_EQ(counts.at(0, 0), 0u);
  EXPECT_EQ(counts.at(0, 1), 1u);
  EXPECT_EQ(counts.at(0, 2), 1u);
  EXPECT_EQ(homes.tokens, (std::vector<std::uint64_t>{1}));
  EXPECT_EQ(homes.first_key, (std::vector<std::uint64_t>{7}));
  for (const std::uint32_t slot : c.trace_slots(0, 0)) EXPECT_EQ(slot, kNoTrace);
}

}  // namespace
}  // namespace moed::runtime
