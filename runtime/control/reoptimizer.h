// Re-optimisation's plan, as a pure function: from the cluster's merged
// routing statistics and the current placement, the slot moves to a better
// placement and the cost before and after, predicted on the statistics'
// sample of tokens. The control plane runs it on a thread of rank 0's own.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "placement/cost_model.h"
#include "placement/optimizer.h"
#include "placement/placement.h"
#include "placement/placement_diff.h"
#include "placement/topology.h"
#include "routing/routing_stats.h"

namespace moed::runtime {

struct ReoptimizeRequest {
  placement::OptimizerPolicy policy = placement::OptimizerPolicy::metis;
  std::optional<int> max_moves;  // at most this many slot moves, best gain first
  int slots_per_rank = 0;        // the slot budget: placement::OptimizeOptions's
  int redundant_slots = -1;
  double load_cap = 0.05;     // metis's objective and pooled share: OptimizeOptions's
  double pooled_share = -1;
  double island_tolerance = 0.02;  // metis's balance and groups: OptimizeOptions's
  int expert_groups = 0;
  double group_hint = 0;
  // Hot experts split into shards (ShardRule's over_mean and shards; its
  // memory budget is slots_per_rank), checked against the run's canonical
  // F-chunks (0: not checked).
  double shard_over_mean = 0;
  int shards = 2;
  bool shard_per_island = false;
  int redundancy = 1;  // every expert on at least this many islands (placement/redundancy.h)
  int ffn_chunks = 0;
};

struct ReoptimizePlan {
  std::vector<placement::Move> moves;
  placement::Cost now, after;  // predicted on the statistics' sample
  std::string pooling;         // how metis chose its pooled share (empty: no choice made)
  std::string error;           // set when planning failed (then nothing else is)
};

// Never throws: a failure comes back as the plan's error.
ReoptimizePlan plan_reoptimization(const routing::RoutingStats& stats, const placement::Placement& current,
                                   const placement::Topology& topology, const ReoptimizeRequest& request);

}  // namespace moed::runtime
