// Config sections of the placement part: [cluster] (islands) and [placement].
#pragma once

#include <cstdint>
#include <string>

#include "common/config_table.h"
#include "placement/optimizer.h"
#include "placement/placement.h"

namespace moed::placement {

struct ClusterConfig {
  std::string islands;
  std::int64_t ranks_per_island = 0;
  bool bind_numa = true;
  double cost_same_island = 1;
  double cost_cross_island = 8;
};

struct PlacementConfig {
  PlacementPolicy policy = PlacementPolicy::contiguous;
  std::string file;
  std::string committed;
  std::int64_t seed = 0;
  std::int64_t max_slots_per_rank = 0;
  // The slot budget of each layer for the optimiser (moectl reoptimize):
  // at most one of the two is set.
  std::int64_t layer_slots_per_rank = 0;
  std::int64_t redundant_slots = -1;
  // How moectl reoptimize plans when the request names no policy, and metis's
  // trade-off (OptimizeOptions's).
  OptimizerPolicy reoptimize_policy = OptimizerPolicy::metis;
  double load_cap = 0.05;
  double pooled_share = -1;
  double island_tolerance = 0.02;
  double group_hint = 0;
  double shard_over_mean = 0;
  std::int64_t shards = 2;
  bool shard_per_island = false;
  std::int64_t redundancy = 1;
};

// Routing statistics the daemon keeps for the placement service.
struct StatsConfig {
  std::string file;
  double half_life_steps = 0;
  std::int64_t every_steps = 0;
  std::int64_t sample_tokens = 0;
  std::int64_t follow_tokens = 0;
};

const config::Section<ClusterConfig>& cluster_config_section();
const config::Section<StatsConfig>& stats_config_section();
const config::Section<PlacementConfig>& placement_config_section();

}  // namespace moed::placement
