// limit_moves: at most N new slots, never worse than the current placement,
// always valid, and no rank filled beyond what current and target hold.
#include "placement/move_limit.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "placement/cost_model.h"
#include "placement/optimizer.h"
#include "placement/placement.h"
#include "placement/placement_diff.h"
#include "placement/topology.h"
#include "routing/routing_stats.h"
#include "routing/routing_trace.h"

namespace moed::placement {
namespace {

using routing::RoutingChoice;
using routing::RoutingStats;
using routing::RoutingTrace;

const RoutingTrace& mixtral_trace() {
  static const RoutingTrace t = routing::read_trace(std::string(MOED_TEST_DATA_DIR) + "/mixtral-humaneval.trace");
  return t;
}

double weighted(const Cost& c) { return 8.0 * c.cross_island_copies_per_token + c.same_island_copies_per_token; }

int max_slots_in_layer(const Placement& p, int layer) {
  int most = 0;
  for (int r = 0; r < p.ranks(); ++r) most = std::max(most, int(p.experts_on(layer, r).size()));
  return most;
}

class LimitMoves : public testing::TestWithParam<std::pair<int, int>> {
 protected:
  void SetUp() override {
    topo_ = Topology::blocks(GetParam().first * GetParam().second, GetParam().second);
    const RoutingStats s = RoutingStats::from_trace(mixtral_trace(), 0, mixtral_trace().tokens());
    current_ = contiguous(topo_.ranks(), s.layers(), s.experts());
    OptimizeOptions o;
    target_ = relabel_to_minimise_moves(current_, optimize(s, topo_, o), topo_);
    total_moves_ = int(move_cost(current_, target_, 1).slots);
    ASSERT_GT(total_moves_, 0);
  }
  Topology topo_{std::vector<int>{0}};
  Placement current_, target_;
  int total_moves_ = 0;
};

TEST_P(LimitMoves, ZeroKeepsCurrent) {
  EXPECT_TRUE(limit_moves(current_, target_, 0, mixtral_trace(), topo_) == current_);
}

TEST_P(LimitMoves, UnlimitedIsNoWorseThanCurrent) {
  Placement p = limit_moves(current_, target_, total_moves_ + 100, mixtral_trace(), topo_);
  EXPECT_NO_THROW(p.validate("limited"));
  double before = weighted(evaluate(mixtral_trace(), current_, topo_));
  double after = weighted(evaluate(mixtral_trace(), p, topo_));
  EXPECT_LE(after, before);
  EXPECT_GT(move_cost(current_, p, 1).slots, 0u) << "no move applied although the target is better";
}

TEST_P(LimitMoves, EveryLimitGivesAValidPlacementWithinBudget) {
  for (int k = 0; k <= total_moves_ + 1; k += std::max(1, k / 3)) {
    SCOPED_TRACE(testing::Message() << "max_moves " << k << " of " << total_moves_);
    Placement p = limit_moves(current_, target_, k, mixtral_trace(), topo_);
    EXPECT_NO_THROW(p.validate("limited"));
    EXPECT_LE(move_cost(current_, p, 1).slots, std::uint64_t(k));
    for (int l = 0; l < p.layers(); ++l)
      EXPECT_LE(max_slots_in_layer(p, l),
                std::max(max_slots_in_layer(current_, l), max_slots_in_layer(target_, l)))
          << "layer " << l;
  }
}

TEST(LimitMovesHand, NeverFillsARankBeyondCurrentAndTarget) {
  // 3 ranks, each its own island. Current: expert e on rank e (1 slot each).
  // Target: e0 moves 0 -> 1, e1 and e2 get replicas on rank 0; ranks hold
  // 2, 2, 1 slots. The moves (sorted by expert):
  //   a: e0 to 1, drops 0    b: e1 new on 0    c: e2 new on 0
  // Sample, homes i mod 3: token 0 (home 0) {0,1}, token 3 (home 0) {0,2},
  // the others at home. Before: 2 cross copies. a alone: token 3 crosses to
  // both ranks 1 and 2 (3 copies: worse, not applied); b alone and c alone
  // each save one. So b and c are applied and a is not: with a kept apart
  // from b and c, rank 0 ends with e0, e1, e2 = 3 slots, more than either
  // placement has (1 and 2). A move that fills a rank belongs with the move
  // that frees a slot there (b with a: together worse, so neither applies;
  // c alone leaves rank 0 at 2).
  const Topology topo({0, 1, 2});
  Placement current = contiguous(3, 1, 3);
  Placement target = current;
  target.set_replicas(0, 0, {1});
  target.set_replicas(0, 1, {1, 0});
  target.set_replicas(0, 2, {2, 0});
  RoutingTrace sample(1, 3);
  for (std::vector<std::uint32_t> experts : {std::vector<std::uint32_t>{0, 1}, {1}, {2}, {0, 2}, {1}, {2}}) {
    std::vector<RoutingChoice> cell;
    for (std::uint32_t e : experts) cell.push_back({e, 1.0f / float(experts.size())});
    sample.add_token({cell});
  }
  for (int k : {1, 2, 3, 10}) {
    Placement p = limit_moves(current, target, k, sample, topo);
    EXPECT_NO_THROW(p.validate("limited"));
    EXPECT_LE(move_cost(current, p, 1).slots, std::uint64_t(k));
    EXPECT_LE(max_slots_in_layer(p, 0), 2) << "max_moves " << k << ": rank 0 holds "
                                            << p.experts_on(0, 0).size() << " slots";
  }
}

INSTANTIATE_TEST_SUITE_P(Mixtral, LimitMoves, testing::Values(std::pair{2, 2}, std::pair{4, 2}),
                         [](const testing::TestParamInfo<std::pair<int, int>>& info) {
                           return std::to_string(info.param.first) + "x" + std::to_string(info.param.second);
                         });

}  // namespace
}  // namespace moed::placement
