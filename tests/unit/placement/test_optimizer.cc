// Placement policies: the properties every optimised placement must have
// (valid, within capacity, replicas spread, deterministic) on the real
// Mixtral trace and on a synthetic workload, the quality that holds by
// construction on the data it was fitted to, and usage errors. Replica counts
// are in test_slot_packing.cc, limit_moves in test_move_limit.cc.
#include "placement/optimizer.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <set>
#include <string>
#include <vector>

#include "common/error.h"
#include "placement/cost_model.h"
#include "placement/metis_partition.h"
#include "placement/placement.h"
#include "placement/topology.h"
#include "routing/routing_stats.h"
#include "routing/routing_trace.h"
#include "routing/synthetic_routing.h"
#include "tests/unit/test_support.h"

namespace moed::placement {
namespace {

using routing::read_trace;
using routing::RoutingStats;
using routing::RoutingTrace;
using routing::synthetic_routing;
using routing::SyntheticRoutingSpec;

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
  OptimizerPolicy policy;
};

// Every policy, in the order of its names.
std::vector<OptimizerPolicy> all_policies() {
  std::vector<OptimizerPolicy> all;
  for (const auto& p : kOptimizerPolicyNames.entries) all.push_back(p.value);
  return all;
}

std::string case_name(const testing::TestParamInfo<OptimizeCase>& info) {
  std::string policy(name_of(info.param.policy));
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
  const OptimizerPolicy policy = GetParam().policy;
  const bool replicates = policy == OptimizerPolicy::metis || policy == OptimizerPolicy::greedy_load;
  OptimizeOptions o;
  o.policy = policy;
  const Optimized optimized = optimize_explained(s, topo, o);
  const Placement& p = optimized.placement;
  ASSERT_EQ(optimized.pooling.has_value(), policy == OptimizerPolicy::metis);
  ASSERT_EQ(p.ranks(), R);
  ASSERT_EQ(p.layers(), s.layers());
  ASSERT_EQ(p.experts(), E);
  EXPECT_NO_THROW(p.validate("optimised"));
  for (int l = 0; l < s.layers(); ++l) {
    SCOPED_TRACE(testing::Message() << "layer " << l);
    // What the policy is allowed per rank: ceil(E / R) for the baselines, the
    // slots replica_counts asks for spread evenly for the replicating ones.
    std::vector<int> wanted = replica_counts(loads_of(s, l), R, layer_slots({}, loads_of(s, l), R, topo.islands()));
    const int total = std::accumulate(wanted.begin(), wanted.end(), 0);
    const int capacity = replicates ? ceil_div(total, R) : ceil_div(E, R);
    for (int r = 0; r < R; ++r) EXPECT_LE(int(p.experts_on(l, r).size()), capacity) << "rank " << r;
    // metis lets the hottest replicated experts (the share it chose) pool their replicas in one island.
    const std::vector<char> pooled =
        pooled_experts(make_slots(loads_of(s, l), wanted), wanted, optimized.pooling ? optimized.pooling->share : 0);
    for (int e = 0; e < E; ++e) {
      const std::vector<int>& ranks = p.replicas(l, e);
      ASSERT_FALSE(ranks.empty()) << "expert " << e;
      EXPECT_EQ(std::set<int>(ranks.begin(), ranks.end()).size(), ranks.size()) << "expert " << e;
      for (int r : ranks) EXPECT_TRUE(r >= 0 && r < R) << "expert " << e << " rank " << r;
      if (replicates)
        EXPECT_EQ(int(ranks.size()), wanted[e]) << "expert " << e;
      else
        EXPECT_EQ(ranks.size(), 1u) << "expert " << e;
      if (policy == OptimizerPolicy::metis && !pooled[e] && int(ranks.size()) <= topo.islands()) {
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
  for (const OptimizerPolicy policy : all_policies()) {
    for (auto [islands, per] : {std::pair{2, 2}, {4, 2}, {1, 4}, {8, 1}})
      cases.push_back({"mixtral", islands, per, policy});
    cases.push_back({"synthetic", 4, 4, policy});
  }
  return cases;
}
INSTANTIATE_TEST_SUITE_P(Policies, Optimize, testing::ValuesIn(optimize_cases()), case_name);

TEST(OptimizeNames, EveryPolicyIsListed) {
  EXPECT_EQ(kOptimizerPolicyNames.names(),
            (std::vector<std::string>{"metis", "greedy-load", "contiguous", "round-robin"}));
}

TEST(OptimizeBaselines, ContiguousAndRoundRobinAreTheUsualMaps) {
  const Topology topo = Topology::blocks(4, 2);
  OptimizeOptions o;
  o.policy = OptimizerPolicy::contiguous;
  EXPECT_TRUE(optimize(mixtral_stats(), topo, o) == contiguous(4, 32, 8));
  o.policy = OptimizerPolicy::round_robin;
  EXPECT_TRUE(optimize(mixtral_stats(), topo, o) == round_robin(4, 32, 8));
}

TEST(OptimizeOptionsTest, WithoutReplicationEveryExpertHasOneSlot) {
  const Topology topo = Topology::blocks(4, 2);
  for (const OptimizerPolicy policy : {OptimizerPolicy::metis, OptimizerPolicy::greedy_load}) {
    OptimizeOptions o;
    o.policy = policy;
    o.replicate = false;
    Placement p = optimize(mixtral_stats(), topo, o);
    for (int l = 0; l < p.layers(); ++l) {
      for (int e = 0; e < p.experts(); ++e) EXPECT_EQ(p.replicas(l, e).size(), 1u) << name_of(policy);
      for (int r = 0; r < 4; ++r) EXPECT_EQ(p.experts_on(l, r).size(), 2u) << name_of(policy);
    }
  }
}

TEST(OptimizeOptionsTest, AffinityAndNoRedundantSlotsKeepTheSameGuarantees) {
  // 4 x 4 on the synthetic statistics: with affinity alignment (islands
  // renamed layer to layer) and with no redundant slots, the slots are still
  // replica_counts' (one per expert for the latter) within ceil(total / R).
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
      std::vector<int> wanted = replica_counts(
          loads_of(s, l), 16, variant == 0 ? layer_slots({}, loads_of(s, l), 16, topo.islands()) : s.experts());
      const int capacity = ceil_div(std::accumulate(wanted.begin(), wanted.end(), 0), 16);
      for (int e = 0; e < s.experts(); ++e)
        EXPECT_EQ(int(p.replicas(l, e).size()), wanted[e]) << "layer " << l << " expert " << e;
      for (int r = 0; r < 16; ++r) EXPECT_LE(int(p.experts_on(l, r).size()), capacity);
    }
  }
}

TEST(OptimizeErrors, UnknownPolicyIsUsageError) {
  test::expect_error([] { kOptimizerPolicyNames.parse("bogus", "--policy"); }, ErrorKind::Usage,
                     {"bogus", "metis"});
}

class OptimizeTooFewSlots : public testing::TestWithParam<OptimizerPolicy> {};

TEST_P(OptimizeTooFewSlots, IsUsageErrorNamingTheNumbers) {
  // 8 experts on 4 ranks need at least 2 slots per rank; 1 is refused
  // whatever the policy (the baselines would silently exceed it).
  OptimizeOptions o;
  o.policy = GetParam();
  o.slots_per_rank = 1;
  test::expect_error([&] { optimize(mixtral_stats(), Topology::blocks(4, 2), o); }, ErrorKind::Usage,
                     {"8 experts", "4 ranks", "at least 2"});
}
INSTANTIATE_TEST_SUITE_P(Policies, OptimizeTooFewSlots, testing::ValuesIn(all_policies()),
                         [](const testing::TestParamInfo<OptimizerPolicy>& info) {
                           std::string n(name_of(info.param));
                           std::replace(n.begin(), n.end(), '-', '_');
                           return n;
                         });

// ---------------------------------------------------------------- budgets

struct BudgetCase {
  std::string data;
  int islands, ranks_per_island;
  int slots_per_rank, redundant;  // as OptimizeOptions
};

class OptimizeBudget : public testing::TestWithParam<std::tuple<BudgetCase, OptimizerPolicy>> {};

// Every slot of the budget is spent, in every layer, by both balancing
// policies, and they spend the same slots: the same replica counts.
TEST_P(OptimizeBudget, EverySlotSpentTheSameByBothPolicies) {
  const auto& [c, policy] = GetParam();
  const RoutingStats& s = c.data == "mixtral" ? mixtral_stats() : synthetic_stats();
  const Topology topo = Topology::blocks(c.islands * c.ranks_per_island, c.ranks_per_island);
  const int R = topo.ranks(), E = s.experts();
  OptimizeOptions o;
  o.policy = policy;
  o.slots_per_rank = c.slots_per_rank;
  o.redundant_slots = c.redundant;
  Placement p = optimize(s, topo, o);
  OptimizeOptions other = o;
  other.policy = policy == OptimizerPolicy::metis ? OptimizerPolicy::greedy_load : OptimizerPolicy::metis;
  Placement q = optimize(s, topo, other);
  EXPECT_NO_THROW(p.validate("optimised"));
  const int total = c.slots_per_rank > 0 ? c.slots_per_rank * R : E + c.redundant;
  const int capacity = ceil_div(total, R);
  for (int l = 0; l < s.layers(); ++l) {
    SCOPED_TRACE(testing::Message() << "layer " << l);
    int spent = 0;
    for (int e = 0; e < E; ++e) {
      const std::vector<int>& ranks = p.replicas(l, e);
      spent += int(ranks.size());
      EXPECT_EQ(std::set<int>(ranks.begin(), ranks.end()).size(), ranks.size()) << "expert " << e;
      EXPECT_EQ(ranks.size(), q.replicas(l, e).size()) << "expert " << e << ": not the same slots";
    }
    EXPECT_EQ(spent, total);
    for (int r = 0; r < R; ++r) EXPECT_LE(int(p.experts_on(l, r).size()), capacity) << "rank " << r;
  }
}

std::vector<BudgetCase> budget_cases() {
  return {// Mixtral on 2 x 2: 8, 10 (not divisible by 4 ranks), 12 and 16 slots per layer.
          {"mixtral", 2, 2, 2, -1}, {"mixtral", 2, 2, 0, 2}, {"mixtral", 2, 2, 3, -1}, {"mixtral", 2, 2, 4, -1},
          {"mixtral", 2, 2, 0, 24},  // every expert on every rank
          {"mixtral", 4, 2, 0, 5},   {"synthetic", 4, 4, 0, 12}, {"synthetic", 4, 4, 3, -1}};
}
std::string budget_case_name(const testing::TestParamInfo<std::tuple<BudgetCase, OptimizerPolicy>>& info) {
  const BudgetCase& c = std::get<0>(info.param);
  std::string n = c.data + "_" + std::to_string(c.islands) + "x" + std::to_string(c.ranks_per_island) + "_" +
                  (c.slots_per_rank ? "spr" + std::to_string(c.slots_per_rank) : "red" + std::to_string(c.redundant)) +
                  "_" + std::string(name_of(std::get<1>(info.param)));
  std::replace(n.begin(), n.end(), '-', '_');
  return n;
}
INSTANTIATE_TEST_SUITE_P(Budgets, OptimizeBudget,
                         testing::Combine(testing::ValuesIn(budget_cases()),
                                          testing::Values(OptimizerPolicy::metis, OptimizerPolicy::greedy_load)),
                         budget_case_name);

TEST(OptimizeBudgetErrors, BudgetsThatCannotHoldOrBeSpentAreUsageErrors) {
  const Topology topo = Topology::blocks(4, 2);
  OptimizeOptions o;
  o.redundant_slots = 25;  // 8 experts x 4 ranks = 32 slots at most
  test::expect_error([&] { optimize(mixtral_stats(), topo, o); }, ErrorKind::Usage, {"25 redundant slots", "at most 24"});
  o.redundant_slots = 2;
  o.slots_per_rank = 3;
  test::expect_error([&] { optimize(mixtral_stats(), topo, o); }, ErrorKind::Usage, {"not both"});
  o.slots_per_rank = 0;
  o.replicate = false;
  test::expect_error([&] { optimize(mixtral_stats(), topo, o); }, ErrorKind::Usage, {"2 redundant slots", "replication off"});
}

// Quality that holds by construction on the data the statistics came from.
TEST(OptimizeQuality, MetisCutsCrossIslandCopiesOnSynthetic) {
  const Topology topo = Topology::blocks(16, 4);
  OptimizeOptions o;
  o.policy = OptimizerPolicy::metis;
  Cost metis = evaluate(synthetic_trace(), optimize(synthetic_stats(), topo, o), topo);
  o.policy = OptimizerPolicy::contiguous;
  Cost base = evaluate(synthetic_trace(), optimize(synthetic_stats(), topo, o), topo);
  EXPECT_LE(metis.cross_island_copies_per_token, 0.8 * base.cross_island_copies_per_token)
      << "metis " << metis.cross_island_copies_per_token << " vs contiguous "
      << base.cross_island_copies_per_token;
}

TEST(OptimizeQuality, BalancingPoliciesKeepRankLoadWithinTenPercentOnSynthetic) {
  const Topology topo = Topology::blocks(16, 4);
  for (const OptimizerPolicy policy : {OptimizerPolicy::metis, OptimizerPolicy::greedy_load}) {
    OptimizeOptions o;
    o.policy = policy;
    Cost c = evaluate(synthetic_trace(), optimize(synthetic_stats(), topo, o), topo);
    EXPECT_LE(c.max_mean_rank_load, 1.10) << name_of(policy);
  }
}

// Strong topics (shaped like the emulated cluster's workload: 32 experts in
// topics of 8, top-4, 2% of choices leave the topic) on 2 islands of 2
// ranks: a hot expert's co-activation sits on one island's worth of
// partners, so metis keeps one replica on each island instead of pooling
// them (pooled, both went to one island here; on the emulated cluster that
// raised cross-island copies from 0.52 to 0.73 per token per layer).
TEST(OptimizeQuality, ConcentratedHotExpertsKeepAReplicaOnEachIsland) {
  const SyntheticRoutingSpec spec{.layers = 2, .experts = 32, .top_k = 4, .topic_size = 8, .cross_topic = 0.02};
  const RoutingTrace trace = synthetic_routing(spec, 0, 4096);
  const RoutingStats stats = RoutingStats::from_trace(trace, 0, trace.tokens());
  const Topology topo = Topology::blocks(4, 2);
  OptimizeOptions o;
  o.policy = OptimizerPolicy::metis;
  const Placement p = optimize(stats, topo, o);
  int replicated = 0;
  for (int l = 0; l < spec.layers; ++l)
    for (int e = 0; e < spec.experts; ++e) {
      const std::vector<int>& ranks = p.replicas(l, e);
      if (ranks.size() != 2) continue;
      ++replicated;
      EXPECT_NE(topo.island_of(ranks[0]), topo.island_of(ranks[1])) << "layer " << l << " expert " << e;
    }
  EXPECT_GT(replicated, 0);
}

}  // namespace
}  // namespace moed::placement
