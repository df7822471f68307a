// Re-optimisation's plan (runtime/control/reoptimizer.h) and the control plane's JSON
// views (runtime/control/control_views.h).
#include <gtest/gtest.h>

#include <algorithm>

#include "placement/placement.h"
#include "placement/placement_diff.h"
#include "placement/redundancy.h"
#include "placement/topology.h"
#include "routing/routing_stats.h"
#include "routing/synthetic_routing.h"
#include "runtime/admin/protocol.h"
#include "runtime/control/control_views.h"
#include "runtime/control/reoptimizer.h"

namespace moed::runtime {
namespace {

const routing::RoutingStats& stats() {
  static const routing::RoutingStats s = [] {
    routing::SyntheticRoutingSpec spec;
    spec.layers = 2;
    spec.experts = 16;
    spec.top_k = 2;
    const routing::RoutingTrace trace = routing::synthetic_routing(spec, 0, 2000);
    return routing::RoutingStats::from_trace(trace, 0, trace.tokens());
  }();
  return s;
}

TEST(Reoptimizer, PlansMovesThatLowerThePredictedCrossIslandTraffic) {
  const auto topology = placement::Topology::blocks(4, 2);
  const auto current = placement::shuffled(4, 2, 16, 7);
  const ReoptimizePlan plan = plan_reoptimization(stats(), current, topology, {});
  ASSERT_TRUE(plan.error.empty()) << plan.error;
  EXPECT_FALSE(plan.moves.empty());
  EXPECT_LT(plan.after.cross_island_copies_per_token, plan.now.cross_island_copies_per_token);
  // Applying the moves gives a valid placement of the same shape.
  const placement::Placement next = placement::apply_moves(current, plan.moves);
  EXPECT_NO_THROW(next.validate("the planned placement"));
}

class MoveLimit : public ::testing::TestWithParam<int> {};

TEST_P(MoveLimit, IsHeld) {
  const auto topology = placement::Topology::blocks(4, 2);
  const auto current = placement::shuffled(4, 2, 16, 7);
  ReoptimizeRequest request;
  request.max_moves = GetParam();
  const ReoptimizePlan plan = plan_reoptimization(stats(), current, topology, request);
  ASSERT_TRUE(plan.error.empty()) << plan.error;
  EXPECT_LE(int(plan.moves.size()), GetParam());
  EXPECT_LE(plan.after.cross_island_copies_per_token, plan.now.cross_island_copies_per_token);
}
INSTANTIATE_TEST_SUITE_P(Limits, MoveLimit, ::testing::Values(0, 1, 3, 8));

TEST(Reoptimizer, AFailureComesBackAsTheError) {
  const auto topology = placement::Topology::blocks(4, 2);
  ReoptimizeRequest request;
  request.slots_per_rank = 1;  // 16 experts do not fit in 4 slots
  const ReoptimizePlan plan = plan_reoptimization(stats(), placement::contiguous(4, 2, 16), topology, request);
  EXPECT_NE(plan.error.find("16 experts"), std::string::npos) << plan.error;
  EXPECT_TRUE(plan.moves.empty());
}

// metis says how it chose its pooled share, against the request's load cap;
// a fixed share or another policy makes no choice.
TEST(Reoptimizer, MetisSaysHowItChoseItsPooledShare) {
  const auto topology = placement::Topology::blocks(4, 2);
  const auto current = placement::contiguous(4, 2, 16);
  ReoptimizeRequest request;
  request.redundant_slots = 4;
  request.load_cap = 0.125;
  const ReoptimizePlan chosen = plan_reoptimization(stats(), current, topology, request);
  ASSERT_TRUE(chosen.error.empty()) << chosen.error;
  EXPECT_NE(chosen.pooling.find("pooled share"), std::string::npos) << chosen.pooling;
  EXPECT_NE(chosen.pooling.find("cap 0.125"), std::string::npos) << chosen.pooling;
  request.pooled_share = 0.5;
  EXPECT_TRUE(plan_reoptimization(stats(), current, topology, request).pooling.empty());
  request.pooled_share = -1;
  request.policy = placement::OptimizerPolicy::greedy_load;
  EXPECT_TRUE(plan_reoptimization(stats(), current, topology, request).pooling.empty());
}

// The request's group hint and island balance reach the optimiser: groups that
// do not divide the model's experts, or a tolerance above 1, fail the plan.
TEST(Reoptimizer, GroupsAndIslandToleranceReachTheOptimizer) {
  const auto topology = placement::Topology::blocks(4, 2);
  const auto current = placement::contiguous(4, 2, 16);
  ReoptimizeRequest request;
  request.pooled_share = 0.5;
  request.expert_groups = 4;
  request.group_hint = 2;
  request.island_tolerance = 0.1;
  const ReoptimizePlan hinted = plan_reoptimization(stats(), current, topology, request);
  EXPECT_TRUE(hinted.error.empty()) << hinted.error;
  request.expert_groups = 5;
  EXPECT_NE(plan_reoptimization(stats(), current, topology, request).error.find("5 expert groups"), std::string::npos);
  request.expert_groups = 4;
  request.island_tolerance = 2;
  EXPECT_NE(plan_reoptimization(stats(), current, topology, request).error.find("island tolerance 2"),
            std::string::npos);
}

// With a shard rule, the plan splits the hot experts of a whole placement and
// cuts them into their shards by migration; shards that do not divide the
// run's canonical chunks fail the plan.
TEST(Reoptimizer, SplitsHotExpertsByCuttingThem) {
  const auto topology = placement::Topology::blocks(4, 2);
  const auto current = placement::contiguous(4, 2, 16);
  ReoptimizeRequest request;
  request.pooled_share = 0.5;
  request.slots_per_rank = 6;  // room for shards beside each rank's 4 experts
  request.shard_over_mean = 1.2;
  request.ffn_chunks = 2;
  const ReoptimizePlan plan = plan_reoptimization(stats(), current, topology, request);
  ASSERT_TRUE(plan.error.empty()) << plan.error;
  const placement::Placement next = placement::apply_moves(current, plan.moves);
  int split = 0;
  for (int l = 0; l < 2; ++l)
    for (int e = 0; e < 16; ++e) split += next.sharded(l, e);
  EXPECT_GT(split, 0) << placement::describe_moves(plan.moves);
  EXPECT_TRUE(std::any_of(plan.moves.begin(), plan.moves.end(), [](const placement::Move& m) { return m.cut; }));
  request.ffn_chunks = 3;
  EXPECT_NE(plan_reoptimization(stats(), current, topology, request).error.find("ffn_chunks"), std::string::npos);
}

// With a redundancy of 2, the plan puts every expert on both islands, and
// then no loss of one island orphans any; one split expert on a single
// island fails the plan, naming it.
TEST(Reoptimizer, KeepsEveryExpertOnTwoIslands) {
  const auto topology = placement::Topology::blocks(4, 2);
  const auto current = placement::contiguous(4, 2, 16);
  ReoptimizeRequest request;
  request.pooled_share = 0.5;
  request.redundancy = 2;
  const ReoptimizePlan plan = plan_reoptimization(stats(), current, topology, request);
  ASSERT_TRUE(plan.error.empty()) << plan.error;
  const placement::Placement next = placement::apply_moves(current, plan.moves);
  for (int l = 0; l < 2; ++l)
    for (int e = 0; e < 16; ++e) EXPECT_EQ(placement::islands_holding(next, topology, l, e), 2) << l << " " << e;
  EXPECT_TRUE(placement::drop_lost_ranks(next, topology.ranks_in(0)).orphans.empty());
  placement::Placement split = current;
  split.set_shards(1, 3, {0, 1});
  EXPECT_NE(plan_reoptimization(stats(), split, topology, request).error.find("layer 1 expert 3 is split"),
            std::string::npos);
}

// The control plane reads the policy of a request the admin protocol checked
// against its own list (the admin room cannot include placement/).
TEST(Reoptimizer, TheAdminPoliciesAreTheOptimizersInOrder) {
  EXPECT_EQ(admin::reoptimize_policies(), placement::kOptimizerPolicyNames.names());
  EXPECT_EQ(name_of(ReoptimizeRequest{}.policy), admin::reoptimize_policies().front());
}

TEST(ControlViews, PlacementAndMigrationJson) {
  placement::Placement p = placement::contiguous(2, 1, 4);
  p.set_epoch(3);
  const auto j = placement_json(p);
  EXPECT_EQ(j["epoch"], 3);
  EXPECT_EQ(j["slots"][0][3], nlohmann::json::array({1}));
  EXPECT_EQ(j["split"], nlohmann::json::array({nlohmann::json::array()}));
  EXPECT_EQ(j["replicas"][0][3], nlohmann::json::array({1}));
  EXPECT_EQ(j["shards"][0], nlohmann::json::object());
  p.set_shards(0, 2, {0, 1});
  const auto split = placement_json(p);
  EXPECT_EQ(split["split"][0], nlohmann::json::array({2}));
  // Shard ranks apart from replicas: expert 2's one copy of shards, and no replica of it.
  EXPECT_EQ(split["shards"][0]["2"], nlohmann::json::parse("[[0, 1]]"));
  EXPECT_EQ(split["replicas"][0][2], nlohmann::json::array());
  EXPECT_EQ(split["replicas"][0][1], nlohmann::json::array({0}));
  EXPECT_EQ(split["slots"][0][2], nlohmann::json::array({0, 1}));
  // Split and replicated: each copy's ranks in shard order.
  placement::Placement copies = placement::contiguous(4, 1, 4);
  copies.set_shards(0, 1, {1, 0, 3, 2}, 2);
  const auto held_twice = placement_json(copies);
  EXPECT_EQ(held_twice["shards"][0]["1"], nlohmann::json::parse("[[1, 0], [3, 2]]"));
  EXPECT_EQ(held_twice["slots"][0][1], nlohmann::json::array({1, 0, 3, 2}));
  EXPECT_EQ(held_twice["replicas"][0][1], nlohmann::json::array());
  EXPECT_EQ(j["model_layers"], nlohmann::json::array({0}));
  EXPECT_FALSE(j.contains("expert_groups"));
  const auto deepseek = placement_json(p, LayerNumbers({3}), {2, 1});
  EXPECT_EQ(deepseek["model_layers"], nlohmann::json::array({3}));
  EXPECT_EQ(deepseek["expert_groups"], (nlohmann::json{{"groups", 2}, {"kept", 1}, {"size", 2}}));
  EXPECT_FALSE(deepseek.contains("slot"));
  const auto fp8 = placement_json(p, {}, {}, {"fp8", [](int shards) { return std::size_t(1000 / shards + 7); }});
  EXPECT_EQ(fp8["slot"], (nlohmann::json{{"dtype", "fp8"}, {"bytes", 1007}, {"shard_bytes", {{"2", 507}}}}));
  EXPECT_TRUE(migration_json(nullptr).is_null());
  MigrationRecord m;
  m.id = 4;
  m.moves = {{0, 3, 1, 0, 1}};
  m.state = MigrationState::aborted;
  m.error = "refused: rank 0";
  m.bytes = 10;
  const auto mj = migration_json(&m);
  EXPECT_EQ(mj["state"], "aborted");
  EXPECT_EQ(mj["error"], "refused: rank 0");
  EXPECT_EQ(mj["from"], 1);
  EXPECT_EQ(mj["steps_during"], 0);
  EXPECT_FALSE(mj.contains("step_ms_p99_during"));
}

TEST(ControlViews, StatsSummaryNamesTheHottestExpert) {
  const auto j = stats_summary(stats());
  EXPECT_EQ(j["per_layer"].size(), 2u);
  for (const auto& layer : j["per_layer"]) EXPECT_GE(layer["hottest_over_mean"].get<double>(), 1.0);
}

}  // namespace
}  // namespace moed::runtime
