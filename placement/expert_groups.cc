#include "placement/expert_groups.h"

#include "common/error.h"
#include "placement/slot_packing.h"

namespace moed::placement {

Placement align_groups_to_islands(const routing::RoutingStats& stats, const Topology& topology, int groups) {
  const int E = stats.experts(), R = topology.ranks(), I = topology.islands();
  if (groups < 1 || E % groups != 0) MOED_THROW(Usage, "{} expert groups do not divide {} experts", groups, E);
  if (groups % I != 0) MOED_THROW(Usage, "{} expert groups cannot be spread evenly over {} islands", groups, I);
  const int size = E / groups, capacity = (E + R - 1) / R;
  for (int i = 0; i < I; ++i)
    if (int(topology.ranks_in(i).size()) * capacity < E / I)
      MOED_THROW(Usage, "island {} has {} ranks of {} slots for its {} experts", i, topology.ranks_in(i).size(),
                 capacity, E / I);
  Placement p(R, stats.layers(), E);
  for (int l = 0; l < stats.layers(); ++l) {
    std::vector<std::vector<ExpertSlot>> on_island(static_cast<std::size_t>(I));
    for (int e = 0; e < E; ++e) on_island[std::size_t((e / size) * I / groups)].push_back({e, stats.load(l, e)});
    for (int i = 0; i < I; ++i) pack_by_load(on_island[std::size_t(i)], topology.ranks_in(i), capacity, l, p);
  }
  p.validate("groups aligned to islands");
  return p;
}

}  // namespace moed::placement
