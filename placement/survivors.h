// The survivors of a loss as the ranks of the next epoch (elastic serving,
// docs/elastic.md): world rank members[i] becomes rank i, as the transport
// numbers them after continue_with() (comm/transport.h). The placement and
// the topology the daemon rebuilds its engine from, renumbered; pure and
// unit-tested apart from the daemon.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "placement/placement.h"
#include "placement/placement_diff.h"
#include "placement/topology.h"

namespace moed::placement {

// `p` over the members: every slot (replica or shard, in the same order) on
// its rank's new number, the epoch kept. `p` must place nothing on a rank
// outside `members` (drop_lost_ranks and adopt_orphans come first): an
// Internal error naming the slot otherwise. Members: ascending ranks of `p`.
Placement placement_on_members(const Placement& p, const std::vector<int>& members);

// `t` over the members: the islands that still hold one renumbered densely
// in their order, the link costs kept.
Topology topology_on_members(const Topology& t, const std::vector<int>& members);

// The world's islands once `joiner` (a join slot, until now an island of
// its own) has come on `host`: the island of the first other present rank
// on that host, or still its own; renumbered densely in order of first
// appearance. `hosts` and `present` are by world rank (an Internal error
// when their sizes differ from the topology's, or `joiner` is out of range).
Topology with_joiner(const Topology& world, const std::vector<std::string>& hosts, const std::vector<char>& present,
                     int joiner, const std::string& host);

// What the survivors of `lost` (ranks of `p`) serve with: the lost slots
// dropped (drop_lost_ranks), the orphans adopted (adopt_orphans, an
// expert's load counted alike for every expert: each survivor must come to
// the same plan from what it alone knows, and the routing statistics differ
// by rank) and the result renumbered over the members. Each rank loads its
// `to_load` from the checkpoint before serving with `placement`.
struct SurvivorsPlan {
  std::vector<int> members;  // the ranks of `p` that are left, ascending: members[i] becomes rank i
  Placement placement;       // over the members
  std::vector<std::vector<std::pair<int, int>>> to_load;  // per new rank: (layer, expert) orphans it adopts
};
SurvivorsPlan plan_for_survivors(const Placement& p, const std::vector<int>& lost, int max_slots = 0);

// Growing (spares admitted, [comm].spares): `p` with `newcomers` more ranks
// after its own, holding nothing yet (the epoch kept).
Placement with_newcomers(const Placement& p, int newcomers);

// The moves that give each newcomer (a rank of `p` holding nothing) its
// share of the slots, which the migration path then carries: one slot at a
// time, from the rank holding the most (the lowest on a tie), of a whole
// expert the newcomer lacks, in the layer where the newcomer holds the
// fewest (then the lowest layer and expert), until it holds the mean per
// rank (rounded down) or no move would narrow the gap. Every rank plans
// alike from the placement alone.
std::vector<Move> moves_to_newcomers(const Placement& p, const std::vector<int>& newcomers);

}  // namespace moed::placement
