#include "placement/placement_config.h"

#include "placement/placement.h"

namespace moed::placement {

const config::Section<ClusterConfig>& cluster_config_section() {
  using C = ClusterConfig;
  static const config::Section<C> section(
      "cluster", "how ranks group into islands (ranks joined by a fast link)",
      {
          config::integer<C>("ranks_per_island", &C::ranks_per_island, 0, 0, 1 << 20,
                             "ranks per island in consecutive blocks; 0 = one island per host"),
      });
  return section;
}

const config::Section<PlacementConfig>& placement_config_section() {
  using C = PlacementConfig;
  static const config::Section<C> section(
      "placement", "where expert slots sit at start",
      {
          config::choice<C>("policy", &C::policy, "contiguous", placement_policy_names(),
                            "placement built at start when no file is given"),
          config::text<C>("file", &C::file, "",
                          "placement file to start from (TOML, see moe-place); overrides policy"),
          config::integer<C>("seed", &C::seed, 1, 0, INT64_MAX, "seed of the shuffled policy"),
          config::integer<C>("max_slots_per_rank", &C::max_slots_per_rank, 0, 0, 1 << 20,
                             "slot capacity per rank over all layers; 0 = unlimited"),
      });
  return section;
}

}  // namespace moed::placement
