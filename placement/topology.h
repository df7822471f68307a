// The topology model placement optimises for: ranks grouped into islands
// (ranks joined by a fast link, NVLink within a node) and the class of the
// link between any two ranks.
#pragma once

#include <string>
#include <vector>

namespace moed::placement {

enum class LinkClass { SameRank = 0, SameIsland = 1, CrossIsland = 2 };
inline constexpr int kLinkClasses = 3;
const char* to_string(LinkClass c);  // "same_rank", "same_island", "cross_island"

class Topology {
 public:
  // island_of_rank[r] is rank r's island; islands are numbered densely from 0.
  explicit Topology(std::vector<int> island_of_rank);
  // Consecutive blocks of ranks_per_island ranks (the last block may be short).
  static Topology blocks(int ranks, int ranks_per_island);

  int ranks() const { return int(island_of_rank_.size()); }
  int islands() const { return islands_; }
  int island_of(int rank) const { return island_of_rank_.at(rank); }
  const std::vector<int>& island_of_ranks() const { return island_of_rank_; }
  std::vector<int> ranks_in(int island) const;
  LinkClass link(int from, int to) const;
  std::string describe() const;  // e.g. "2 islands: {0,1} {2,3}"

  // Relative cost of one token copy over each link class (same rank: 0).
  // Defaults: 1 within an island, 8 across (NVLink against a node's NIC).
  double link_cost(LinkClass c) const { return cost_[int(c)]; }
  void set_link_costs(double same_island, double cross_island);

 private:
  std::vector<int> island_of_rank_;
  int islands_ = 0;
  double cost_[kLinkClasses] = {0.0, 1.0, 8.0};
};

}  // namespace moed::placement
