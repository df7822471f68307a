// Expert groups aligned to islands (align_groups_to_islands): each group
// whole on its island, every expert once, ranks balanced by load inside the
// island, and group-limited routing then touching at most its kept groups'
// islands; shapes that cannot align are usage errors.
#include "placement/expert_groups.h"

#include <gtest/gtest.h>

#include <set>

#include "common/error.h"
#include "placement/cost_model.h"
#include "placement/optimizer.h"
#include "routing/routing_stats.h"
#include "routing/synthetic_routing.h"
#include "tests/unit/test_support.h"

namespace moed::placement {
namespace {

routing::RoutingTrace grouped_routing() {
  routing::SyntheticRoutingSpec spec;
  spec.layers = 2;
  spec.experts = 64;
  spec.top_k = 8;
  spec.groups = 8;
  spec.groups_kept = 4;
  return routing::synthetic_routing(spec, 0, 4000);
}

TEST(ExpertGroups, EachGroupSitsWholeOnItsIslandAndRoutingReachesAtMostItsKeptGroups) {
  const routing::RoutingTrace trace = grouped_routing();
  const routing::RoutingStats stats = routing::RoutingStats::from_trace(trace, 0, trace.tokens());
  for (int islands : {8, 4}) {
    SCOPED_TRACE(testing::Message() << islands << " islands");
    const Topology topology = Topology::blocks(16, 16 / islands);
    const Placement p = align_groups_to_islands(stats, topology, 8);
    for (int l = 0; l < 2; ++l)
      for (int e = 0; e < 64; ++e) {
        ASSERT_EQ(p.replicas(l, e).size(), 1u);
        EXPECT_EQ(topology.island_of(p.replicas(l, e)[0]), (e / 8) * islands / 8) << "layer " << l << " expert " << e;
      }
    const Cost c = evaluate(trace, p, topology);
    EXPECT_EQ(c.share_over_islands(4), 0.0) << "a token reached more islands than its 4 kept groups";
    EXPECT_LT(c.max_mean_rank_load, 1.6);
  }
}

TEST(ExpertGroups, ShapesThatCannotAlignAreUsageErrors) {
  const routing::RoutingTrace trace = grouped_routing();
  const routing::RoutingStats stats = routing::RoutingStats::from_trace(trace, 0, trace.tokens());
  test::expect_error([&] { align_groups_to_islands(stats, Topology::blocks(16, 2), 6); }, ErrorKind::Usage,
                     {"6 expert groups", "64 experts"});
  test::expect_error([&] { align_groups_to_islands(stats, Topology::blocks(16, 1), 8); }, ErrorKind::Usage,
                     {"8 expert groups", "16 islands"});
}

// Groups of `p`'s layer `l` (8 of 8 experts) whose experts all sit on one island.
int whole_groups(const Placement& p, const Topology& topology, int l) {
  int whole = 0;
  for (int g = 0; g < 8; ++g) {
    std::set<int> islands;
    for (int e = g * 8; e < g * 8 + 8; ++e)
      for (int r : p.replicas(l, e)) islands.insert(topology.island_of(r));
    whole += islands.size() == 1;
  }
  return whole;
}

TEST(ExpertGroups, MetisGivenTheGroupsAsAHintKeepsThemOnTheirIslands) {
  const routing::RoutingTrace trace = grouped_routing();
  const routing::RoutingStats stats = routing::RoutingStats::from_trace(trace, 0, trace.tokens());
  const Topology topology = Topology::blocks(16, 2);
  OptimizeOptions o;
  o.redundant_slots = 0;
  o.pooled_share = 0.5;  // no replicas: nothing to choose
  o.island_tolerance = 0.25;
  const Placement free = optimize(stats, topology, o);
  o.expert_groups = 8;
  o.group_hint = 1000;
  const Placement hinted = optimize(stats, topology, o);
  // Free, METIS follows co-activation across groups; hinted, most groups
  // stay whole (not all: island slot counts and loads still split some).
  for (int l = 0; l < 2; ++l) {
    SCOPED_TRACE(testing::Message() << "layer " << l);
    EXPECT_LE(whole_groups(free, topology, l), 1);
    EXPECT_GE(whole_groups(hinted, topology, l), 4);
  }
  EXPECT_LT(evaluate(trace, hinted, topology).max_mean_rank_load, 1.6);
}

TEST(ExpertGroups, MetisRefusesGroupsThatDoNotDivideTheExpertsAndBadKnobs) {
  const routing::RoutingStats stats = routing::RoutingStats::from_trace(grouped_routing(), 0, 4000);
  const Topology topology = Topology::blocks(16, 2);
  OptimizeOptions o;
  o.expert_groups = 6;
  test::expect_error([&] { optimize(stats, topology, o); }, ErrorKind::Usage, {"6 expert groups", "64 experts"});
  o.expert_groups = 8;
  o.group_hint = -1;
  test::expect_error([&] { optimize(stats, topology, o); }, ErrorKind::Usage, {"group hint -1"});
  o.group_hint = 1;
  o.island_tolerance = 1.5;
  test::expect_error([&] { optimize(stats, topology, o); }, ErrorKind::Usage, {"island tolerance 1.5"});
}

}  // namespace
}  // namespace moed::placement
