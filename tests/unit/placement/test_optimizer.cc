// Placement policies: replica counts on hand cases, the properties every
// optimised placement must have (valid, within capacity, replicas spread,
// deterministic) on the real Mixtral trace and on a synthetic workload, the
// quality that holds by construction on the data it was fitted to, usage
// errors, and limit_moves (at most N new slots, never worse, valid).
#include "placement/optimizer.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <set>
#include <string>
#include <vector>

#include "common/error.h"
#include "placement/cost_model.h"
#include "placement/placement.h"
#include "placement/placement_diff.h"
#include "placement/topology.h"
#include "routing/routing_stats.h"
#include "routing/routing_trace.h"
#include "routing/synthetic_routing.h"
#include "tests/unit/test_support.h"

namespace moed::placement {
namespace {

using routing::read_trace;
using routing::RoutingChoice;
using routing::RoutingStats;
using routing::RoutingTrace;
using routing::synthetic_routing;
using routing::SyntheticRoutingSpec;

// ---------------------------------------------------------------- replica_counts

TEST(ReplicaCounts, NoHotExpertMeansOneSlotEach) {
  // Fair share 8 / 2 = 4; no expert above it.
  EXPECT_EQ(replica_counts({1, 1, 3, 3}, 2, 0), (std::vector<int>{1, 1, 1, 1}));
  // Exactly the fair share is not hot: 2 of 4 on 2 ranks.
  EXPECT_EQ(replica_counts({2, 1, 1}, 2, 0), (std::vector<int>{1, 1, 1}));
  // No load at all: one slot each, redundant slots or not.
  EXPECT_EQ(replica_counts({0, 0, 0}, 2, 0, 3), (std::vector<int>{1, 1, 1}));
}

TEST(ReplicaCounts, HotExpertGetsCeilOfLoadOverFairShare) {
  // Total 8 on 4 ranks: fair share 2; expert 0 carries 5 = 2.5 shares -> 3 slots.
  EXPECT_EQ(replica_counts({5, 1, 1, 1}, 4, 0), (std::vector<int>{3, 1, 1, 1}));
  // 4 = exactly 2 shares of 2 -> 2 slots (no rounding up past an exact multiple).
  EXPECT_EQ(replica_counts({4, 2, 1, 1}, 4, 0), (std::vector<int>{2, 1, 1, 1}));
  // All the load on one expert: 4 shares on 4 ranks -> a slot on every rank.
  EXPECT_EQ(replica_counts({9, 0, 0, 0}, 4, 0), (std::vector<int>{4, 1, 1, 1}));
}

struct RedundantCase {
  int redundant;
  std::vector<int> expected;
};
class ReplicaCountsRedundant : public testing::TestWithParam<RedundantCase> {};

// Loads {8, 3, 2, 1} on 4 ranks: fair share 14 / 4 = 3.5, expert 0 is 2.29
// shares -> 3 slots. Load per slot then 2.67, 3, 2, 1; each redundant slot
// goes to the largest:
//   +1: expert 1 (3)    -> {3,2,1,1}; per slot 2.67, 1.5, 2, 1
//   +2: expert 0 (2.67) -> {4,2,1,1}; per slot 2, 1.5, 2, 1 (expert 0 now on every rank)
//   +3: expert 2 (2)    -> {4,2,2,1}; per slot -, 1.5, 1, 1
//   +4: expert 1 (1.5)  -> {4,3,2,1}
TEST_P(ReplicaCountsRedundant, GoToMostLoadPerSlotOneByOne) {
  EXPECT_EQ(replica_counts({8, 3, 2, 1}, 4, 0, GetParam().redundant), GetParam().expected);
}
INSTANTIATE_TEST_SUITE_P(Steps, ReplicaCountsRedundant,
                         testing::Values(RedundantCase{0, {3, 1, 1, 1}}, RedundantCase{1, {3, 2, 1, 1}},
                                         RedundantCase{2, {4, 2, 1, 1}}, RedundantCase{3, {4, 2, 2, 1}},
                                         RedundantCase{4, {4, 3, 2, 1}}));

TEST(ReplicaCounts, NeverMoreReplicasThanRanks) {
  // Fair share 6 on 2 ranks: expert 0 (10) -> 2 = ranks. The redundant slots
  // can only go to experts below 2 slots: {2,2,2}, then none is left.
  EXPECT_EQ(replica_counts({10, 1, 1}, 2, 0, 5), (std::vector<int>{2, 2, 2}));
  for (int redundant : {0, 1, 7, 50}) {
    std::vector<int> r = replica_counts({40, 30, 1, 1, 1, 1, 1, 1}, 3, 0, redundant);
    for (int n : r) {
      EXPECT_GE(n, 1);
      EXPECT_LE(n, 3);
    }
  }
}

TEST(ReplicaCounts, TrimmingDropsLeastNeededReplicaFirst) {
  // {8,3,2,1} with 4 redundant: {4,3,2,1} = 10 slots. Into 4 ranks x 2 = 8:
  // dropping one slot of e leaves load/(r-1) per slot: e0 8/3 = 2.67,
  // e1 3/2 = 1.5, e2 2/1 = 2 -> drop e1's: {4,2,2,1} = 9; then e0 2.67,
  // e1 3, e2 2 -> drop e2's: {4,2,1,1} = 8.
  EXPECT_EQ(replica_counts({8, 3, 2, 1}, 4, 2, 4), (std::vector<int>{4, 2, 1, 1}));
  // Into 4 x 1 = 4: on to e0 (2.67) {3,2,1,1}, e1 (3 vs e0 4) {3,1,1,1},
  // then e0 alone {2,1,1,1}, {1,1,1,1}.
  EXPECT_EQ(replica_counts({8, 3, 2, 1}, 4, 1, 4), (std::vector<int>{1, 1, 1, 1}));
  // Room enough: nothing trimmed.
  EXPECT_EQ(replica_counts({8, 3, 2, 1}, 4, 3, 4), (std::vector<int>{4, 3, 2, 1}));
  // Hot replicas are trimmed too: {3,1,1,1} = 6 slots into 4 x 1 = 4.
  EXPECT_EQ(replica_counts({5, 1, 1, 1}, 4, 1), (std::vector<int>{1, 1, 1, 1}));
}

// ---------------------------------------------------------------- shared data

const RoutingTrace& mixtral_trace() {
  static const RoutingTrace t = read_trace(std::string(MOED_TEST_DATA_DIR) + "/mixtral-humaneval.trace");
  return t;
}
const RoutingStats& mixtral_stats() {
  static const RoutingStats s = RoutingStats::from_trace(mixtral_trace(), 0, mixtral_trace().tokens());
  return s;
}
const RoutingTrace& synthetic_trace() {
  static const RoutingTrace t = [] {
    SyntheticRoutingSpec spec;
    spec.layers = 4;
    spec.experts = 32;
    spec.top_k = 4;
    return synthetic_routing(spec, 0, 4000);
  }();
  return t;
}
const RoutingStats& synthetic_stats() {
  static const RoutingStats s = RoutingStats::from_trace(synthetic_trace(), 0, synthetic_trace().tokens());
  return s;
}

std::vector<double> loads_of(const RoutingStats& s, int layer) {
  std::vector<double> loads(s.experts());
  for (int e = 0; e < s.experts(); ++e) loads[e] = s.load(layer, e);
  return loads;
}

int ceil_div(int a, int b) { return (a + b - 1) / b; }

// ---------------------------------------------------------------- optimize

struct OptimizeCase {
  std::string data;  // "mixtral" or "synthetic"
  int islands, ranks_per_island;
  std::string policy;
};

std::string case_name(const testing::TestParamInfo<OptimizeCase>& info) {
  std::string policy = info.param.policy;
  std::replace(policy.begin(), policy.end(), '-', '_');
  return info.param.data + "_" + std::to_string(info.param.islands) + "x" +
         std::to_string(info.param.ranks_per_island) + "_" + policy;
}

class Optimize : public testing::TestWithParam<OptimizeCase> {
 protected:
  const RoutingStats& stats() const {
    return GetParam().data == "mixtral" ? mixtral_stats() : synthetic_stats();
  }
  Topology topology() const {
    return Topology::blocks(GetParam().islands * GetParam().ranks_per_island, GetParam().ranks_per_island);
  }
  Placement run() const {
    OptimizeOptions o;
    o.policy = GetParam().policy;
    return optimize(stats(), topology(), o);
  }
};

TEST_P(Optimize, ValidAndWithinCapacity) {
  const RoutingStats& s = stats();
  const Topology topo = topology();
  const int R = topo.ranks(), E = s.experts();
  const std::string& policy = GetParam().policy;
  const bool replicates = policy == "metis" || policy == "greedy-load";
  Placement p = run();
  ASSERT_EQ(p.ranks(), R);
  ASSERT_EQ(p.layers(), s.layers());
  ASSERT_EQ(p.experts(), E);
  EXPECT_NO_THROW(p.validate("optimised"));
  for (int l = 0; l < s.layers(); ++l) {
    SCOPED_TRACE(testing::Message() << "layer " << l);
    // What the policy is allowed per rank: ceil(E / R) for the baselines, the
    // slots replica_counts asks for spread evenly for the replicating ones.
    std::vector<int> wanted = replica_counts(loads_of(s, l), R, 0, topo.islands());
    const int total = std::accumulate(wanted.begin(), wanted.end(), 0);
    const int capacity = replicates ? ceil_div(total, R) : ceil_div(E, R);
    for (int r = 0; r < R; ++r) EXPECT_LE(int(p.experts_on(l, r).size()), capacity) << "rank " << r;
    for (int e = 0; e < E; ++e) {
      const std::vector<int>& ranks = p.replicas(l, e);
      ASSERT_FALSE(ranks.empty()) << "expert " << e;
      EXPECT_EQ(std::set<int>(ranks.begin(), ranks.end()).size(), ranks.size()) << "expert " << e;
      for (int r : ranks) EXPECT_TRUE(r >= 0 && r < R) << "expert " << e << " rank " << r;
      if (replicates)
        EXPECT_EQ(int(ranks.size()), wanted[e]) << "expert " << e;
      else
        EXPECT_EQ(ranks.size(), 1u) << "expert " << e;
      if (policy == "metis" && int(ranks.size()) <= topo.islands()) {
        std::set<int> islands;
        for (int r : ranks) islands.insert(topo.island_of(r));
        EXPECT_EQ(islands.size(), ranks.size()) << "expert " << e << ": replicas share an island";
      }
    }
  }
}

TEST_P(Optimize, Deterministic) { EXPECT_TRUE(run() == run()); }

TEST_P(Optimize, RequestedSlotsPerRankAreKept) {
  // Exactly ceil(E / R) slots per rank: no room for replicas, and every rank full.
  const RoutingStats& s = stats();
  const Topology topo = topology();
  OptimizeOptions o;
  o.policy = GetParam().policy;
  o.slots_per_rank = ceil_div(s.experts(), topo.ranks());
  Placement p = optimize(s, topo, o);
  EXPECT_NO_THROW(p.validate("optimised"));
  for (int l = 0; l < s.layers(); ++l)
    for (int r = 0; r < topo.ranks(); ++r)
      EXPECT_LE(int(p.experts_on(l, r).size()), o.slots_per_rank) << "layer " << l << " rank " << r;
}

std::vector<OptimizeCase> optimize_cases() {
  std::vector<OptimizeCase> cases;
  for (const std::string& policy : optimizer_policy_names()) {
    for (auto [islands, per] : {std::pair{2, 2}, {4, 2}, {1, 4}, {8, 1}})
      cases.push_back({"mixtral", islands, per, policy});
    cases.push_back({"synthetic", 4, 4, policy});
  }
  return cases;
}
INSTANTIATE_TEST_SUITE_P(Policies, Optimize, testing::ValuesIn(optimize_cases()), case_name);

TEST(OptimizeNames, EveryPolicyIsListed) {
  EXPECT_EQ(optimizer_policy_names(),
            (std::vector<std::string>{"metis", "greedy-load", "contiguous", "round-robin"}));
}

TEST(OptimizeBaselines, ContiguousAndRoundRobinAreTheUsualMaps) {
  const Topology topo = Topology::blocks(4, 2);
  OptimizeOptions o;
  o.policy = "contiguous";
  EXPECT_TRUE(optimize(mixtral_stats(), topo, o) == contiguous(4, 32, 8));
  o.policy = "round-robin";
  EXPECT_TRUE(optimize(mixtral_stats(), topo, o) == round_robin(4, 32, 8));
}

TEST(OptimizeOptionsTest, WithoutReplicationEveryExpertHasOneSlot) {
  const Topology topo = Topology::blocks(4, 2);
  for (const std::string policy : {"metis", "greedy-load"}) {
    OptimizeOptions o;
    o.policy = policy;
    o.replicate = false;
    Placement p = optimize(mixtral_stats(), topo, o);
    for (int l = 0; l < p.layers(); ++l) {
      for (int e = 0; e < p.experts(); ++e) EXPECT_EQ(p.replicas(l, e).size(), 1u) << policy;
      for (int r = 0; r < 4; ++r) EXPECT_EQ(p.experts_on(l, r).size(), 2u) << policy;
    }
  }
}

TEST(OptimizeOptionsTest, AffinityAndNoRedundantSlotsKeepTheSameGuarantees) {
  // 4 x 4 on the synthetic statistics: with affinity alignment (islands
  // renamed layer to layer) and with no redundant slots, the slots are still
  // replica_counts' (redundant = 0 for the latter) within ceil(total / R).
  const Topology topo = Topology::blocks(16, 4);
  const RoutingStats& s = synthetic_stats();
  for (int variant = 0; variant < 2; ++variant) {
    SCOPED_TRACE(variant == 0 ? "affinity" : "redundant_slots = 0");
    OptimizeOptions o;
    o.affinity = variant == 0;
    if (variant == 1) o.redundant_slots = 0;
    Placement p = optimize(s, topo, o);
    EXPECT_NO_THROW(p.validate("optimised"));
    EXPECT_TRUE(p == optimize(s, topo, o));
    for (int l = 0; l < s.layers(); ++l) {
      std::vector<int> wanted = replica_counts(loads_of(s, l), 16, 0, variant == 0 ? topo.islands() : 0);
      const int capacity = ceil_div(std::accumulate(wanted.begin(), wanted.end(), 0), 16);
      for (int e = 0; e < s.experts(); ++e)
        EXPECT_EQ(int(p.replicas(l, e).size()), wanted[e]) << "layer " << l << " expert " << e;
      for (int r = 0; r < 16; ++r) EXPECT_LE(int(p.experts_on(l, r).size()), capacity);
    }
  }
}

TEST(OptimizeErrors, UnknownPolicyIsUsageError) {
  OptimizeOptions o;
  o.policy = "bogus";
  test::expect_error([&] { optimize(mixtral_stats(), Topology::blocks(4, 2), o); }, ErrorKind::Usage,
                     {"bogus", "metis"});
}

class OptimizeTooFewSlots : public testing::TestWithParam<std::string> {};

TEST_P(OptimizeTooFewSlots, IsUsageErrorNamingTheNumbers) {
  // 8 experts on 4 ranks need at least 2 slots per rank; 1 is refused
  // whatever the policy (the baselines would silently exceed it).
  OptimizeOptions o;
  o.policy = GetParam();
  o.slots_per_rank = 1;
  test::expect_error([&] { optimize(mixtral_stats(), Topology::blocks(4, 2), o); }, ErrorKind::Usage,
                     {"8 experts", "4 ranks", "at least 2"});
}
INSTANTIATE_TEST_SUITE_P(Policies, OptimizeTooFewSlots, testing::ValuesIn(optimizer_policy_names()),
                         [](const testing::TestParamInfo<std::string>& info) {
                           std::string n = info.param;
                           std::replace(n.begin(), n.end(), '-', '_');
                           return n;
                         });

// Quality that holds by construction on the data the statistics came from.
TEST(OptimizeQuality, MetisCutsCrossIslandCopiesOnSynthetic) {
  const Topology topo = Topology::blocks(16, 4);
  OptimizeOptions o;
  o.policy = "metis";
  Cost metis = evaluate(synthetic_trace(), optimize(synthetic_stats(), topo, o), topo);
  o.policy = "contiguous";
  Cost base = evaluate(synthetic_trace(), optimize(synthetic_stats(), topo, o), topo);
  EXPECT_LE(metis.cross_island_copies_per_token, 0.8 * base.cross_island_copies_per_token)
      << "metis " << metis.cross_island_copies_per_token << " vs contiguous "
      << base.cross_island_copies_per_token;
}

TEST(OptimizeQuality, BalancingPoliciesKeepRankLoadWithinTenPercentOnSynthetic) {
  const Topology topo = Topology::blocks(16, 4);
  for (const std::string policy : {"metis", "greedy-load"}) {
    OptimizeOptions o;
    o.policy = policy;
    Cost c = evaluate(synthetic_trace(), optimize(synthetic_stats(), topo, o), topo);
    EXPECT_LE(c.max_mean_rank_load, 1.10) << policy;
  }
}

// ---------------------------------------------------------------- limit_moves

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
    const RoutingStats& s = mixtral_stats();
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
