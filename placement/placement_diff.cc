#include "placement/placement_diff.h"

#include <algorithm>
#include <iterator>
#include <map>
#include <tuple>
#include <utility>

#include "common/error.h"
#include "placement/assignment.h"

namespace moed::placement {
namespace {

void check_same_shape(const Placement& a, const Placement& b, const char* what) {
  MOED_CHECK(a.ranks() == b.ranks() && a.layers() == b.layers() && a.experts() == b.experts(),
             "{}: placements of different shapes ({} ranks x {} layers x {} experts vs {} x {} x {})",
             what, a.ranks(), a.layers(), a.experts(), b.ranks(), b.layers(), b.experts());
}

// " of copy c" for a shard of a split expert's second copy on; nothing for its first.
std::string copy_label(const Move& m) { return m.copy ? fmt::format(" of copy {}", m.copy) : ""; }

bool holds(const std::vector<int>& ranks, int rank) {
  return std::find(ranks.begin(), ranks.end(), rank) != ranks.end();
}

std::vector<int> sorted(std::vector<int> v) {
  std::sort(v.begin(), v.end());
  return v;
}

using Matrix = std::vector<std::vector<long>>;

// kept[a][b]: slots that rank a holds in `current` and rank b holds in `next`,
// i.e. the slots that stay in place if next's rank b is renamed a.
Matrix rank_overlap(const Placement& current, const Placement& next) {
  Matrix kept(current.ranks(), std::vector<long>(current.ranks(), 0));
  for (int l = 0; l < current.layers(); ++l)
    for (int e = 0; e < current.experts(); ++e)
      for (int a : current.replicas(l, e))
        for (int b : next.replicas(l, e)) ++kept.at(a).at(b);  // at: ranks out of range throw
  return kept;
}

// (island, replicas there) for the islands that hold a slot of one expert.
std::vector<std::pair<int, int>> count_by_island(const std::vector<int>& ranks,
                                                 const Topology& topology) {
  std::vector<std::pair<int, int>> out;
  for (int r : ranks) {
    const int island = topology.island_of(r);
    auto it = std::find_if(out.begin(), out.end(), [&](const auto& c) { return c.first == island; });
    if (it == out.end())
      out.emplace_back(island, 1);
    else
      ++it->second;
  }
  return out;
}

// shared[i][j]: slots of next's island j that current's island i also holds,
// counting an expert min(replicas in i, replicas in j) times: the slots that
// stay on their island if next's island j is renamed i.
Matrix island_overlap(const Placement& current, const Placement& next, const Topology& topology) {
  Matrix shared(topology.islands(), std::vector<long>(topology.islands(), 0));
  for (int l = 0; l < current.layers(); ++l)
    for (int e = 0; e < current.experts(); ++e)
      for (auto [i, in_current] : count_by_island(current.replicas(l, e), topology))
        for (auto [j, in_next] : count_by_island(next.replicas(l, e), topology))
          shared[i][j] += std::min(in_current, in_next);
  return shared;
}

// The best renaming of next's ranks `from` onto current's ranks `onto` (equal
// sizes): onto[a] takes from[match[a]]. Returns the slots it keeps in place.
long match_ranks(const Matrix& kept, const std::vector<int>& onto, const std::vector<int>& from,
                 std::vector<int>& match) {
  std::vector<std::vector<double>> gain(onto.size(), std::vector<double>(from.size()));
  for (std::size_t a = 0; a < onto.size(); ++a)
    for (std::size_t b = 0; b < from.size(); ++b) gain[a][b] = double(kept[onto[a]][from[b]]);
  match = max_gain_assignment(gain);
  long total = 0;
  for (std::size_t a = 0; a < onto.size(); ++a) total += kept[onto[a]][from[match[a]]];
  return total;
}

long total_slots(const Placement& p) {
  long n = 0;
  for (int l = 0; l < p.layers(); ++l)
    for (int e = 0; e < p.experts(); ++e) n += long(p.replicas(l, e).size());
  return n;
}

// `p` with rank r renamed new_rank[r]; replica order and epoch are kept.
Placement rename_ranks(const Placement& p, const std::vector<int>& new_rank) {
  Placement out(p.ranks(), p.layers(), p.experts());
  out.set_epoch(p.epoch());
  for (int l = 0; l < p.layers(); ++l) {
    for (int e = 0; e < p.experts(); ++e) {
      std::vector<int> ranks = p.replicas(l, e);
      for (int& r : ranks) r = new_rank.at(r);
      if (p.sharded(l, e))
        out.set_shards(l, e, std::move(ranks), p.shards(l, e));
      else
        out.set_replicas(l, e, std::move(ranks));
    }
  }
  return out;
}

// The rank of current that `move` reads from: a rank that keeps the expert
// (never dropped by any move, so the source stays valid whichever subset of
// the moves is applied, and in whatever order), else the lowest rank that
// this move does not drop, else the dropped rank itself; -1 if none holds it.
int source_rank(const std::vector<int>& kept, const std::vector<int>& current_sorted, int drop) {
  if (!kept.empty()) return kept.front();
  for (int r : current_sorted)
    if (r != drop) return r;
  return current_sorted.empty() ? -1 : current_sorted.front();
}

// A whole expert split by `next`: each shard of each copy cut from a whole
// copy (the shard's own rank where it holds one, so those bytes stay on the
// rank, else one in its copy, else the holder in the copy's place in
// `current`'s order), and every holder that keeps no shard released.
void cut_moves(const Placement& current, const Placement& next, int l, int e, std::vector<Move>& out) {
  const std::vector<int>& holders = current.replicas(l, e);
  const std::vector<int>& shard_ranks = next.replicas(l, e);
  const int S = next.shards(l, e);
  for (int c = 0; c < next.copies(l, e); ++c) {
    const std::span<const int> ranks = next.copy(l, e, c);
    int source = holders[std::size_t(c) % holders.size()];
    for (int r : ranks)
      if (holds(holders, r)) {
        source = r;
        break;
      }
    for (int s = 0; s < S; ++s) {
      const int to = ranks[std::size_t(s)];
      out.push_back({l, e, holds(holders, to) ? to : source, to, -1, s, S, true, c});
    }
  }
  for (int r : holders)
    if (!holds(shard_ranks, r)) out.push_back({l, e, -1, -1, r, 0, S, true});
}

// The moves of one split expert: each shard whose rank changes, from its holder.
void shard_moves(const Placement& current, const Placement& next, int l, int e, std::vector<Move>& out) {
  const int S = current.shards(l, e), copies = current.copies(l, e);
  if (next.shards(l, e) != S || next.copies(l, e) != copies)
    MOED_THROW(Input,
               "layer {} expert {} is split into {} shard(s) now and {} in the new placement, held {} and {} "
               "time(s): a migration moves shards and splits whole experts, it does not re-split or merge a split "
               "one, nor add or drop its copies (restart with the new placement)",
               l, e, S, next.shards(l, e), copies, next.copies(l, e));
  const std::vector<int>& cur = current.replicas(l, e);
  const std::vector<int>& nxt = next.replicas(l, e);
  for (std::size_t i = 0; i < cur.size(); ++i) {
    if (cur[i] == nxt[i]) continue;
    const int s = int(i) % S, c = int(i) / S;
    if (holds(cur, nxt[i]))
      MOED_THROW(Input,
                 "layer {} expert {}: shard {} would move to rank {}, which holds shard {} of it until the "
                 "migration ends (a rank holds one shard of an expert); move them in two migrations",
                 l, e, s, nxt[i], current.shard_on(l, e, nxt[i]));
    out.push_back({l, e, cur[i], nxt[i], cur[i], s, S, false, c});
  }
}

}  // namespace

Placement relabel_to_minimise_moves(const Placement& current, const Placement& next,
                                    const Topology& topology) {
  check_same_shape(current, next, "relabel_to_minimise_moves");
  MOED_CHECK(topology.ranks() == next.ranks(), "topology of {} ranks for a placement of {} ranks",
             topology.ranks(), next.ranks());
  const int islands = topology.islands();
  std::vector<std::vector<int>> members(islands);
  for (int i = 0; i < islands; ++i) members[i] = topology.ranks_in(i);
  const bool equal_islands = std::all_of(members.begin(), members.end(), [&](const auto& m) {
    return m.size() == members[0].size();
  });
  const Matrix kept = rank_overlap(current, next);

  // island_of_next[i]: the island of next renamed to current's island i.
  std::vector<int> island_of_next(islands);
  for (int i = 0; i < islands; ++i) island_of_next[i] = i;
  if (equal_islands && islands > 1) {
    // The gain of renaming next's island j to i is what the best renaming of
    // ranks inside that pair keeps in place, so that the island step and the
    // rank step together find the relabelling (among those that map islands
    // onto islands) keeping the most slots: never more moves than `next`.
    // Between equal counts, the slots that stay on their island (not on their
    // rank) decide, so fewer copies cross the network. Both are integers, so
    // kept * (slots + 1) + on_island orders them exactly.
    const Matrix shared = island_overlap(current, next, topology);
    const double scale = double(total_slots(next) + 1);
    std::vector<std::vector<double>> gain(islands, std::vector<double>(islands));
    std::vector<int> match;
    for (int i = 0; i < islands; ++i)
      for (int j = 0; j < islands; ++j)
        gain[i][j] = double(match_ranks(kept, members[i], members[j], match)) * scale +
                     double(shared[i][j]);
    island_of_next = max_gain_assignment(gain);
  }

  std::vector<int> new_rank(next.ranks(), -1);
  for (int i = 0; i < islands; ++i) {
    const auto& onto = members[i];
    const auto& from = members[island_of_next[i]];
    std::vector<int> match;
    match_ranks(kept, onto, from, match);
    for (std::size_t a = 0; a < onto.size(); ++a) new_rank[from[match[a]]] = onto[a];
  }
  return rename_ranks(next, new_rank);
}

std::vector<Move> moves(const Placement& current, const Placement& next) {
  check_same_shape(current, next, "moves");
  std::vector<Move> out;
  for (int l = 0; l < current.layers(); ++l) {
    for (int e = 0; e < current.experts(); ++e) {
      if (!current.sharded(l, e) && next.sharded(l, e)) {
        cut_moves(current, next, l, e, out);
        continue;
      }
      if (current.sharded(l, e) || next.sharded(l, e)) {
        shard_moves(current, next, l, e, out);
        continue;
      }
      const std::vector<int> cur = sorted(current.replicas(l, e));
      const std::vector<int> nxt = sorted(next.replicas(l, e));
      std::vector<int> added, removed, kept;
      std::set_difference(nxt.begin(), nxt.end(), cur.begin(), cur.end(), std::back_inserter(added));
      std::set_difference(cur.begin(), cur.end(), nxt.begin(), nxt.end(),
                          std::back_inserter(removed));
      std::set_intersection(cur.begin(), cur.end(), nxt.begin(), nxt.end(),
                            std::back_inserter(kept));
      const std::size_t pairs = std::min(added.size(), removed.size());
      for (std::size_t k = 0; k < pairs; ++k)
        out.push_back({l, e, source_rank(kept, cur, removed[k]), added[k], removed[k]});
      for (std::size_t k = pairs; k < added.size(); ++k)
        out.push_back({l, e, source_rank(kept, cur, -1), added[k], -1});
      for (std::size_t k = pairs; k < removed.size(); ++k) out.push_back({l, e, -1, -1, removed[k]});
    }
  }
  // Releases have to = -1 and so come first within an expert; the order stays
  // deterministic among them through `drop`.
  std::sort(out.begin(), out.end(), [](const Move& a, const Move& b) {
    return std::tie(a.layer, a.expert, a.to, a.drop) < std::tie(b.layer, b.expert, b.to, b.drop);
  });
  return out;
}

// Splits every whole expert that `chosen` cuts, with all its cut moves at
// once: each shard exactly once, from a holder; every holder either keeps a
// shard or is released.
void apply_cuts(Placement& out, const std::vector<Move>& chosen) {
  std::map<std::pair<int, int>, std::vector<const Move*>> cuts;
  for (const Move& m : chosen)
    if (m.cut) cuts[{m.layer, m.expert}].push_back(&m);
  for (const auto& [key, group] : cuts) {
    const auto [l, e] = key;
    if (l < 0 || l >= out.layers() || e < 0 || e >= out.experts())
      MOED_THROW(Internal, "cut of layer {} expert {}: outside the placement's {} layers x {} experts", l, e,
                 out.layers(), out.experts());
    if (out.sharded(l, e)) MOED_THROW(Internal, "cut of layer {} expert {}: it is split already", l, e);
    const int S = group.front()->shards;
    int copies = 0;
    for (const Move* m : group) copies = std::max(copies, m->to >= 0 ? m->copy + 1 : 0);
    const std::vector<int>& holders = out.replicas(l, e);
    std::vector<int> shard_ranks(std::size_t(std::max(S, 0) * copies), -1);
    std::vector<int> released;
    for (const Move* m : group) {
      if (m->shards != S || S < 2)
        MOED_THROW(Internal, "cut of layer {} expert {}: moves into {} and {} shards", l, e, S, m->shards);
      if (m->to < 0) {
        if (!holds(holders, m->drop)) MOED_THROW(Internal, "cut of layer {} expert {}: rank {} holds none", l, e, m->drop);
        released.push_back(m->drop);
        continue;
      }
      const std::size_t at = std::size_t(m->copy) * std::size_t(S) + std::size_t(m->shard);
      if (m->shard < 0 || m->shard >= S || m->copy < 0 || shard_ranks[at] >= 0 || !holds(holders, m->from) ||
          m->to >= out.ranks() || m->drop >= 0)
        MOED_THROW(Internal, "cut of layer {} expert {}: shard {} of {} to rank {} from rank {} (copy {}) is not a cut",
                   l, e, m->shard, S, m->to, m->from, m->copy);
      shard_ranks[at] = m->to;
    }
    for (std::size_t i = 0; i < shard_ranks.size(); ++i)
      if (shard_ranks[i] < 0)
        MOED_THROW(Internal, "cut of layer {} expert {}: shard {} of {} is missing (copy {}; a cut applies whole)",
                   l, e, i % std::size_t(S), S, i / std::size_t(S));
    for (int r : holders)
      if (!holds(shard_ranks, r) && !holds(released, r))
        MOED_THROW(Internal, "cut of layer {} expert {}: rank {} would keep its whole copy (a cut applies whole)", l,
                   e, r);
    out.set_shards(l, e, std::move(shard_ranks), S);
  }
}

Placement apply_moves(const Placement& current, const std::vector<Move>& chosen) {
  Placement out = current;
  apply_cuts(out, chosen);
  for (const Move& m : chosen) {
    if (m.cut) continue;
    if (m.layer < 0 || m.layer >= out.layers() || m.expert < 0 || m.expert >= out.experts())
      MOED_THROW(Internal, "move of layer {} expert {}: outside the placement's {} layers x {} experts",
                 m.layer, m.expert, out.layers(), out.experts());
    for (int r : {m.from, m.to, m.drop})
      if (r < -1 || r >= out.ranks())
        MOED_THROW(Internal, "move of layer {} expert {}: rank {} outside 0..{}", m.layer, m.expert,
                   r, out.ranks() - 1);
    if (m.to < 0 && m.drop < 0)
      MOED_THROW(Internal, "move of layer {} expert {}: neither adds nor releases a slot", m.layer,
                 m.expert);
    std::vector<int> ranks = out.replicas(m.layer, m.expert);
    if (out.shards(m.layer, m.expert) != m.shards)
      MOED_THROW(Internal, "move of layer {} expert {}: a move of shards of {}, but it is split into {}", m.layer,
                 m.expert, m.shards, out.shards(m.layer, m.expert));
    const std::size_t at = std::size_t(m.copy) * std::size_t(m.shards) + std::size_t(m.shard);
    if (m.shards > 1 && (m.to < 0 || m.drop < 0 || m.shard < 0 || m.shard >= m.shards || m.copy < 0 ||
                         at >= ranks.size() || ranks[at] != m.drop))
      MOED_THROW(Internal, "move of layer {} expert {}: shard {} of {} (copy {}) is not moved from its holder",
                 m.layer, m.expert, m.shard, m.shards, m.copy);
    if (m.to >= 0 && holds(ranks, m.to))
      MOED_THROW(Internal, "move of layer {} expert {}: rank {} already holds a slot of it", m.layer,
                 m.expert, m.to);
    if (m.drop >= 0 && !holds(ranks, m.drop))
      MOED_THROW(Internal, "move of layer {} expert {}: rank {} holds no slot of it to release",
                 m.layer, m.expert, m.drop);
    if (m.to >= 0 && m.drop >= 0) {
      *std::find(ranks.begin(), ranks.end(), m.drop) = m.to;  // the new slot takes the old's place
    } else if (m.to >= 0) {
      ranks.push_back(m.to);
    } else {
      ranks.erase(std::find(ranks.begin(), ranks.end(), m.drop));
      if (ranks.empty())
        MOED_THROW(Internal, "move of layer {} expert {}: releasing rank {} leaves it no slot",
                   m.layer, m.expert, m.drop);
    }
    if (m.shards > 1)
      out.set_shards(m.layer, m.expert, std::move(ranks), m.shards);
    else
      out.set_replicas(m.layer, m.expert, std::move(ranks));
  }
  return out;
}

std::string describe_moves(const std::vector<Move>& moves) {
  std::string out;
  for (const Move& m : moves) {
    out += fmt::format("layer {} expert {}: ", m.layer, m.expert);
    if (m.cut && m.to < 0)
      out += fmt::format("split into {} shards: releases rank {}", m.shards, m.drop);
    else if (m.cut)
      out += fmt::format("split into {} shards: shard {}{} on rank {} (cut from rank {})", m.shards, m.shard,
                         copy_label(m), m.to, m.from);
    else if (m.shards > 1)
      out += fmt::format("shard {} of {}{}: rank {} -> rank {}", m.shard, m.shards, copy_label(m), m.from, m.to);
    else if (m.to >= 0 && m.drop >= 0)
      out += fmt::format("rank {} -> rank {} (drops rank {})", m.from, m.to, m.drop);
    else if (m.to >= 0 && m.from >= 0)
      out += fmt::format("new replica on rank {} (copied from rank {})", m.to, m.from);
    else if (m.to >= 0)
      out += fmt::format("new replica on rank {}", m.to);
    else
      out += fmt::format("releases rank {}", m.drop);
    out += '\n';
  }
  return out;
}

}  // namespace moed::placement
