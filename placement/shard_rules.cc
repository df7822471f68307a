#include "placement/shard_rules.h"

#include "common/error.h"

namespace moed::placement {

void check_shards(const Placement& p, int ffn_chunks, const Topology& topology, const std::string& origin) {
  MOED_CHECK(topology.ranks() == p.ranks(), "a topology of {} ranks for a placement of {}", topology.ranks(),
             p.ranks());
  for (int l = 0; l < p.layers(); ++l)
    for (int e = 0; e < p.experts(); ++e) {
      const int S = p.shards(l, e);
      if (S == 1) continue;
      if (ffn_chunks % S != 0)
        MOED_THROW(Input,
                   "{}: layer {} expert {} is split into {} shards, which does not divide [experts].ffn_chunks "
                   "= {} (each shard must hold whole canonical chunks)",
                   origin, l, e, S, ffn_chunks);
      for (int c = 0; c < p.copies(l, e); ++c) {
        const std::span<const int> ranks = p.copy(l, e, c);
        for (int r : ranks)
          if (topology.island_of(r) != topology.island_of(ranks[0]))
            MOED_THROW(Input,
                       "{}: layer {} expert {}: shard 0{} is on rank {} (island {}) but a shard is on rank {} "
                       "(island {}); the shards of an expert must share an island (each copy its own, when it has several)",
                       origin, l, e, p.copies(l, e) > 1 ? fmt::format(" of copy {}", c) : "", ranks[0],
                       topology.island_of(ranks[0]), r, topology.island_of(r));
      }
    }
}

}  // namespace moed::placement
