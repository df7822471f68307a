#include "placement/placement_config.h"

#include "placement/placement.h"

namespace moed::placement {

const config::Section<ClusterConfig>& cluster_config_section() {
  using C = ClusterConfig;
  static const config::Section<C> section(
      "cluster", "how ranks group into islands (ranks joined by a fast link)",
      {
          config::text<C>("islands", &C::islands, "",
                          "explicit islands: each rank's island in rank order, e.g. \"0,0,1,1\"; "
                          "empty = ranks_per_island"),
          config::integer<C>("ranks_per_island", &C::ranks_per_island, 0, 0, 1 << 20,
                             "ranks per island in consecutive blocks; 0 = hwloc's NVLink islands, "
                             "else one island per host"),
          config::flag<C>("bind_numa", &C::bind_numa, true,
                          "bind each rank to the cores of its GPU's NUMA node (hwloc); a rank "
                          "already bound within them (launch/moed-rank) is left as it is"),
          config::real<C>("cost_same_island", &C::cost_same_island, 1, 0, 1e6,
                          "relative cost of a token copy inside an island (NVLink)"),
          config::real<C>("cost_cross_island", &C::cost_cross_island, 8, 0, 1e6,
                          "relative cost of a token copy between islands (the network)"),
      });
  return section;
}

const config::Section<StatsConfig>& stats_config_section() {
  using C = StatsConfig;
  static const config::Section<C> section(
      "stats", "routing statistics for the placement service (moe-place optimize --stats)",
      {
          config::text<C>("file", &C::file, "",
                          "stats file rank 0 writes (atomically); empty = keep no statistics"),
          config::real<C>("half_life_steps", &C::half_life_steps, 64, 0, 1e9,
                          "steps after which a routing decision counts half; 0 = never decay"),
          config::integer<C>("every_steps", &C::every_steps, 16, 1, 1 << 30,
                             "steps between gathers to rank 0 and file writes (and at exit)"),
          config::integer<C>("sample_tokens", &C::sample_tokens, 4096, 0, 1 << 24,
                             "recent token paths kept for the cost model, over all ranks"),
          config::integer<C>("follow_tokens", &C::follow_tokens, 4096, 1, 1 << 24,
                             "front-door tokens each rank follows across layers (by request id and "
                             "position) for affinity and sampled paths; the oldest is forgotten first"),
      });
  return section;
}

const config::Section<PlacementConfig>& placement_config_section() {
  using C = PlacementConfig;
  static const config::Section<C> section(
      "placement", "where expert slots sit at start",
      {
          config::choice<C>("policy", &C::policy, PlacementPolicy::contiguous, kPlacementPolicyNames,
                            "placement built at start when no file is given"),
          config::text<C>("file", &C::file, "",
                          "placement file to start from (TOML, see moe-place); overrides policy"),
          config::text<C>("committed", &C::committed, "",
                          "where each committed placement is written (atomically); at start, "
                          "an existing one is resumed in preference to file and policy"),
          config::integer<C>("seed", &C::seed, 1, 0, INT64_MAX, "seed of the shuffled policy"),
          config::integer<C>("max_slots_per_rank", &C::max_slots_per_rank, 0, 0, 1 << 20,
                             "slot capacity per rank over all layers; 0 = unlimited"),
          config::integer<C>("layer_slots_per_rank", &C::layer_slots_per_rank, 0, 0, 1 << 20,
                             "reoptimize's slot budget: slots per rank in each layer, every one spent "
                             "(replicas of the most loaded experts); 0 = not set"),
          config::integer<C>("redundant_slots", &C::redundant_slots, -1, -1, 1 << 20,
                             "reoptimize's slot budget: slots per layer beyond one per expert; -1 = not "
                             "set (with neither: hot experts' replicas plus one slot per island)"),
          config::choice<C>("reoptimize_policy", &C::reoptimize_policy, OptimizerPolicy::metis,
                            kOptimizerPolicyNames, "the policy moectl reoptimize plans with when it names none"),
          config::real<C>("load_cap", &C::load_cap, 0.05, 0, 1e6,
                          "reoptimize's metis: max/mean rank load at most the load-only baseline's "
                          "(greedy-load) + this, then the fewest cross-island copies"),
          config::real<C>("pooled_share", &C::pooled_share, -1, -1, 1,
                          "reoptimize's metis: share of replicated experts whose replicas may share an "
                          "island; -1 = chosen on the statistics' sample against load_cap"),
          config::real<C>("island_tolerance", &C::island_tolerance, 0.02, 0, 1,
                          "reoptimize's metis: how far above the mean an island's load per rank may stay"),
          config::real<C>("group_hint", &C::group_hint, 0, 0, 1e6,
                          "reoptimize's metis, with a group-limited router: co-activation inside an expert "
                          "group weighs 1 + this in the cut; 0 = groups ignored"),
          config::real<C>("shard_over_mean", &C::shard_over_mean, 0, 0, 1e6,
                          "reoptimize: split each expert whose load exceeds this times its layer's mean into "
                          "`shards` shards on one island (as moe-place optimize --shard-over-mean); 0 = never"),
          config::integer<C>("shards", &C::shards, 2, 2, 1 << 16,
                             "reoptimize's split experts: shards each (must divide [experts].ffn_chunks)"),
          config::flag<C>("shard_per_island", &C::shard_per_island, false,
                          "reoptimize's split of a replicated expert: a copy of `shards` shards on each "
                          "island of its replicas (false: one copy, on the island holding most)"),
          config::integer<C>("redundancy", &C::redundancy, 1, 1, 1 << 16,
                             "every expert on at least this many islands, from the start and after each "
                             "reoptimize (a replica added on each missing one), so a lost rank or host leaves "
                             "each a copy; 1 = no constraint"),
      });
  return section;
}

}  // namespace moed::placement
