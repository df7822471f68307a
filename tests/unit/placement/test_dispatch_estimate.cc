// Replicas' shares as dispatch sends them (dispatch_slot_loads), on hand
// cases: each token is sent once from every home island, weighted by the
// island's ranks, to a replica in its home island, else in an island it
// already visits, else the least used.
#include "placement/dispatch_estimate.h"

#include <gtest/gtest.h>

#include <vector>

namespace moed::placement {
namespace {

using routing::RoutingChoice;
using routing::RoutingTrace;

// One layer, 3 experts; every token routes to `experts` in that order.
RoutingTrace tokens_choosing(const std::vector<std::uint32_t>& experts, int tokens) {
  RoutingTrace t(1, 3);
  std::vector<RoutingChoice> cell;
  for (std::uint32_t e : experts) cell.push_back({e, 1.0f});
  for (int i = 0; i < tokens; ++i) t.add_token({cell});
  return t;
}

std::vector<double> loads(const std::vector<ExpertSlot>& slots) {
  std::vector<double> out;
  for (const ExpertSlot& s : slots) out.push_back(s.load);
  return out;
}

TEST(DispatchSlotLoads, ReplicasInEveryIslandShareEvenly) {
  // Expert 2 in both islands of 2 x 1: every home island has its own replica.
  const std::vector<ExpertSlot> slots{{0, 4}, {1, 4}, {2, 3}, {2, 3}};
  const std::vector<int> island{0, 1, 0, 1};
  auto out = dispatch_slot_loads(tokens_choosing({2}, 10), 0, 10, 0, slots, island, Topology::blocks(2, 1));
  EXPECT_EQ(loads(out), (std::vector<double>{4, 4, 3, 3}));
}

TEST(DispatchSlotLoads, TheReplicaBesideThePartnersDrawsTheOtherIslandsTokens) {
  // 3 islands x 1 rank; expert 0 only in island 0, expert 2 in islands 0 and 1.
  // A token routed to 0 then 2: from home 0 it stays in 0; from home 1 it uses
  // island 1's replica; from home 2 it already visits island 0 (for expert 0)
  // and uses that replica. Island 0's replica serves 2/3 of expert 2's 6.
  const std::vector<ExpertSlot> slots{{0, 5}, {1, 1}, {2, 3}, {2, 3}};
  const std::vector<int> island{0, 2, 0, 1};
  auto out = dispatch_slot_loads(tokens_choosing({0, 2}, 30), 0, 30, 0, slots, island, Topology::blocks(3, 1));
  ASSERT_EQ(out.size(), 4u);
  EXPECT_DOUBLE_EQ(out[0].load, 5);  // single slots keep their load
  EXPECT_DOUBLE_EQ(out[1].load, 1);
  EXPECT_NEAR(out[2].load, 4, 1e-9);
  EXPECT_NEAR(out[3].load, 2, 1e-9);
  // The order of a token's experts matters as it does to dispatch: 2 first,
  // from home 2 no island is visited yet, and the least used replica takes it.
  out = dispatch_slot_loads(tokens_choosing({2, 0}, 30), 0, 30, 0, slots, island, Topology::blocks(3, 1));
  EXPECT_NEAR(out[2].load + out[3].load, 6, 1e-9);
  EXPECT_NEAR(out[2].load, 3, 0.2);
}

TEST(DispatchSlotLoads, AnExpertTheSampleNeverRoutesKeepsEvenShares) {
  const std::vector<ExpertSlot> slots{{0, 2}, {1, 1}, {2, 3}, {2, 3}};
  const std::vector<int> island{0, 0, 0, 1};
  auto out = dispatch_slot_loads(tokens_choosing({0}, 8), 0, 8, 0, slots, island, Topology::blocks(2, 1));
  EXPECT_EQ(loads(out), (std::vector<double>{2, 1, 3, 3}));
  // No tokens at all: everything as it was.
  out = dispatch_slot_loads(tokens_choosing({0}, 8), 0, 0, 0, slots, island, Topology::blocks(2, 1));
  EXPECT_EQ(loads(out), (std::vector<double>{2, 1, 3, 3}));
}

}  // namespace
}  // namespace moed::placement
