#include "placement/survivors.h"

#include <fmt/ranges.h>

#include <algorithm>
#include <optional>
#include <tuple>

#include "common/error.h"
#include "placement/redundancy.h"

namespace moed::placement {

namespace {

void check_members(const std::vector<int>& members, int ranks) {
  MOED_CHECK(!members.empty() && std::is_sorted(members.begin(), members.end()) &&
                 std::adjacent_find(members.begin(), members.end()) == members.end() && members.front() >= 0 &&
                 members.back() < ranks,
             "members [{}] are not ascending ranks of {}", fmt::join(members, " "), ranks);
}

}  // namespace

Placement placement_on_members(const Placement& p, const std::vector<int>& members) {
  check_members(members, p.ranks());
  std::vector<int> new_rank(std::size_t(p.ranks()), -1);
  for (std::size_t i = 0; i < members.size(); ++i) new_rank[std::size_t(members[i])] = int(i);
  Placement out(int(members.size()), p.layers(), p.experts());
  out.set_epoch(p.epoch());
  for (int l = 0; l < p.layers(); ++l)
    for (int e = 0; e < p.experts(); ++e) {
      std::vector<int> ranks;
      for (int r : p.replicas(l, e)) {
        MOED_CHECK(new_rank[std::size_t(r)] >= 0, "layer {} expert {} has a slot on rank {}, not among [{}]", l, e, r,
                   fmt::join(members, " "));
        ranks.push_back(new_rank[std::size_t(r)]);
      }
      if (p.sharded(l, e))
        out.set_shards(l, e, std::move(ranks), p.shards(l, e));
      else
        out.set_replicas(l, e, std::move(ranks));
    }
  return out;
}

Topology topology_on_members(const Topology& t, const std::vector<int>& members) {
  check_members(members, t.ranks());
  std::vector<int> new_island(std::size_t(t.islands()), -1), island_of_rank;
  int islands = 0;
  for (int r : members) {
    int& island = new_island[std::size_t(t.island_of(r))];
    if (island < 0) island = islands++;
    island_of_rank.push_back(island);
  }
  Topology out(std::move(island_of_rank));
  out.set_link_costs(t.link_cost(LinkClass::SameIsland), t.link_cost(LinkClass::CrossIsland));
  return out;
}

Topology with_joiner(const Topology& world, const std::vector<std::string>& hosts, const std::vector<char>& present,
                     int joiner, const std::string& host) {
  const std::size_t n = std::size_t(world.ranks());
  MOED_CHECK(hosts.size() == n && present.size() == n && joiner >= 0 && std::size_t(joiner) < n,
             "with_joiner: {} hosts, {} present flags and joiner {} for {} world ranks", hosts.size(), present.size(),
             joiner, n);
  std::vector<int> islands = world.island_of_ranks();
  for (std::size_t r = 0; r < n; ++r)
    if (int(r) != joiner && present[r] && hosts[r] == host) {
      islands[std::size_t(joiner)] = islands[r];
      break;
    }
  std::vector<int> dense(std::size_t(world.islands()), -1);
  int next = 0;
  for (int& island : islands) {
    int& renumbered = dense[std::size_t(island)];
    if (renumbered < 0) renumbered = next++;
    island = renumbered;
  }
  Topology out(std::move(islands));
  out.set_link_costs(world.link_cost(LinkClass::SameIsland), world.link_cost(LinkClass::CrossIsland));
  return out;
}

SurvivorsPlan plan_for_survivors(const Placement& p, const std::vector<int>& lost, int max_slots) {
  const LossPlan dropped = drop_lost_ranks(p, lost);
  SurvivorsPlan plan;
  for (int r = 0; r < p.ranks(); ++r)
    if (std::find(lost.begin(), lost.end(), r) == lost.end()) plan.members.push_back(r);
  if (plan.members.empty()) MOED_THROW(Runtime, "every rank of the placement is lost: nothing survives to serve");
  Placement adopted = dropped.survivors;
  if (!dropped.orphans.empty()) adopted = adopt_orphans(dropped, alike_loads(p.layers(), p.experts()), lost, max_slots);
  plan.placement = placement_on_members(adopted, plan.members);
  plan.to_load.resize(plan.members.size());
  for (const auto& [l, e] : dropped.orphans)
    for (int r : plan.placement.replicas(l, e)) plan.to_load[std::size_t(r)].emplace_back(l, e);
  return plan;
}

Placement with_newcomers(const Placement& p, int newcomers) {
  MOED_CHECK(newcomers >= 0, "{} newcomers", newcomers);
  Placement out(p.ranks() + newcomers, p.layers(), p.experts());
  out.set_epoch(p.epoch());
  for (int l = 0; l < p.layers(); ++l)
    for (int e = 0; e < p.experts(); ++e) {
      if (p.sharded(l, e))
        out.set_shards(l, e, p.replicas(l, e), p.shards(l, e));
      else
        out.set_replicas(l, e, p.replicas(l, e));
    }
  return out;
}

std::vector<Move> moves_to_newcomers(const Placement& p, const std::vector<int>& newcomers) {
  Placement now = p;
  std::vector<int> slots(std::size_t(p.ranks()));
  int total = 0;
  for (int r = 0; r < p.ranks(); ++r) total += slots[std::size_t(r)] = p.slots_on(r);
  const int share = total / std::max(1, p.ranks());
  std::vector<Move> moves;
  for (int n : newcomers) {
    MOED_CHECK(n >= 0 && n < p.ranks() && p.slots_on(n) == 0, "rank {} is not a newcomer of the placement", n);
    while (slots[std::size_t(n)] < share) {
      int donor = n == 0 ? 1 : 0;
      for (int r = 0; r < p.ranks(); ++r)
        if (r != n && slots[std::size_t(r)] > slots[std::size_t(donor)]) donor = r;
      if (slots[std::size_t(donor)] <= slots[std::size_t(n)] + 1) break;  // a move would not narrow the gap
      // (the newcomer's slots in the layer, layer, expert): the smallest.
      std::optional<std::tuple<std::size_t, int, int>> pick;
      for (int l = 0; l < p.layers(); ++l) {
        const std::size_t held = now.experts_on(l, n).size();
        for (int e : now.experts_on(l, donor))
          if (!now.sharded(l, e) && now.shard_on(l, e, n) < 0 && (!pick || std::tuple(held, l, e) < *pick))
            pick = std::tuple(held, l, e);
      }
      if (!pick) break;  // the donor holds nothing the newcomer may take
      const auto [held, l, e] = *pick;
      moves.push_back({l, e, donor, n, donor, 0, 1, false, 0});
      std::vector<int> ranks = now.replicas(l, e);
      std::replace(ranks.begin(), ranks.end(), donor, n);
      now.set_replicas(l, e, std::move(ranks));
      --slots[std::size_t(donor)];
      ++slots[std::size_t(n)];
    }
  }
  return moves;
}

}  // namespace moed::placement
