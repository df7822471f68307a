#include "placement/topology.h"

#include <algorithm>

#include "common/error.h"

namespace moed::placement {

const char* to_string(LinkClass c) {
  switch (c) {
    case LinkClass::SameRank: return "same_rank";
    case LinkClass::SameIsland: return "same_island";
    case LinkClass::CrossIsland: return "cross_island";
  }
  return "?";
}

Topology::Topology(std::vector<int> island_of_rank) : island_of_rank_(std::move(island_of_rank)) {
  MOED_CHECK(!island_of_rank_.empty(), "a topology needs at least one rank");
  islands_ = *std::max_element(island_of_rank_.begin(), island_of_rank_.end()) + 1;
  std::vector<bool> used(islands_, false);
  for (int i : island_of_rank_) {
    MOED_CHECK(i >= 0, "negative island {}", i);
    used[i] = true;
  }
  MOED_CHECK(std::all_of(used.begin(), used.end(), [](bool u) { return u; }),
             "islands must be numbered densely from 0");
}

Topology Topology::blocks(int ranks, int ranks_per_island) {
  MOED_CHECK(ranks > 0 && ranks_per_island > 0, "ranks {} ranks_per_island {}", ranks, ranks_per_island);
  std::vector<int> island(ranks);
  for (int r = 0; r < ranks; ++r) island[r] = r / ranks_per_island;
  return Topology(std::move(island));
}

std::vector<int> Topology::ranks_in(int island) const {
  std::vector<int> out;
  for (int r = 0; r < ranks(); ++r)
    if (island_of_rank_[r] == island) out.push_back(r);
  return out;
}

LinkClass Topology::link(int from, int to) const {
  if (from == to) return LinkClass::SameRank;
  return island_of(from) == island_of(to) ? LinkClass::SameIsland : LinkClass::CrossIsland;
}

void Topology::set_link_costs(double same_island, double cross_island) {
  MOED_CHECK(same_island >= 0 && cross_island >= 0, "negative link costs {} {}", same_island, cross_island);
  cost_[int(LinkClass::SameIsland)] = same_island;
  cost_[int(LinkClass::CrossIsland)] = cross_island;
}

std::string Topology::describe() const {
  std::string out = fmt::format("{} island{}:", islands_, islands_ == 1 ? "" : "s");
  for (int i = 0; i < islands_; ++i) {
    std::vector<int> rs = ranks_in(i);
    out += " {";
    for (size_t j = 0; j < rs.size(); ++j) out += (j ? "," : "") + std::to_string(rs[j]);
    out += "}";
  }
  return out;
}

}  // namespace moed::placement
