// A placement: for every MoE layer, which ranks hold a slot (a copy of the
// weights) of each expert. A hot expert may have several slots (replicas),
// or be split into S shards (tensor sharding), one per rank of one island:
// shard s holds F/S of its FFN (kernels/cpu/expert_ffn.h). A split expert
// may also be replicated: G copies, each S shards on one island.
// A copy is the unit that computes a chunk of an expert's rows: a replica of
// a whole expert, or the S shards of one copy of a split one.
// The epoch numbers placements; a cluster serves with one epoch at a time.
//
// Pure data and pure policies: no MPI, no threads.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "common/name_table.h"

namespace moed::placement {

class Placement {
 public:
  Placement() = default;
  Placement(int ranks, int layers, int experts);  // every expert unplaced

  int ranks() const { return ranks_; }
  int layers() const { return layers_; }
  int experts() const { return experts_; }
  std::uint64_t epoch() const { return epoch_; }
  void set_epoch(std::uint64_t epoch) { epoch_ = epoch; }

  // Ranks holding a slot of (layer, expert), in replica order.
  const std::vector<int>& replicas(int layer, int expert) const;
  void set_replicas(int layer, int expert, std::vector<int> ranks);
  // Splits (layer, expert) into `shards` >= 2 shards (0: ranks.size()), held
  // in ranks.size() / shards copies: shard s of copy c on ranks[c * shards + s]
  // (replicas() then lists them, copy after copy, each in shard order).
  // set_replicas makes an expert whole again.
  void set_shards(int layer, int expert, std::vector<int> ranks, int shards = 0);
  // Shards of (layer, expert): 1 when whole.
  int shards(int layer, int expert) const;
  bool sharded(int layer, int expert) const { return shards(layer, expert) > 1; }
  // Copies of (layer, expert): its replicas when whole, its groups of shards when split.
  int copies(int layer, int expert) const;
  // The ranks of copy c, in shard order (one rank for a whole expert).
  std::span<const int> copy(int layer, int expert, int c) const;
  // The shard `rank` holds (0 for a whole copy), or -1 when it holds none.
  int shard_on(int layer, int expert, int rank) const;
  // The copy `rank` holds part of, or -1 when it holds none.
  int copy_on(int layer, int expert, int rank) const;
  bool any_sharded() const;

  // Experts with a slot on `rank` in `layer`, ascending.
  std::vector<int> experts_on(int layer, int rank) const;
  // Slots `rank` holds over all layers.
  int slots_on(int rank) const;
  int max_slots_per_rank() const;

  // Every expert placed at least once, ranks in range, no rank twice for one
  // expert (so no rank holds two shards of one), every shard of every copy present, and
  // (when max_slots > 0) at most max_slots slots on any rank (a shard is a slot).
  // Throws an Input error prefixed with `origin`.
  void validate(const std::string& origin, int max_slots = 0) const;

  bool operator==(const Placement&) const = default;

 private:
  int ranks_ = 0, layers_ = 0, experts_ = 0;
  std::uint64_t epoch_ = 0;
  std::vector<std::vector<int>> slots_;  // [layer * experts + expert] -> ranks
  std::vector<int> shards_;              // [layer * experts + expert] -> S (1: whole)
};

// Expert e on rank e / ceil(E / R): the usual default.
Placement contiguous(int ranks, int layers, int experts);
// Expert e on rank e mod R.
Placement round_robin(int ranks, int layers, int experts);
// Per layer a seeded random permutation of experts, cut into contiguous blocks:
// as balanced as `contiguous` but with arbitrary expert-to-rank maps.
Placement shuffled(int ranks, int layers, int experts, std::uint64_t seed);
// Adds `extra` replicas per layer to seeded random experts, each on a seeded
// random rank that does not hold that expert yet (for tests of replica paths).
Placement add_random_replicas(Placement p, int extra, std::uint64_t seed);

// The policies above by name: "contiguous", "round-robin", "shuffled".
enum class PlacementPolicy { contiguous, round_robin, shuffled };
inline constexpr auto kPlacementPolicyNames = config::name_table<PlacementPolicy>(
    {{PlacementPolicy::contiguous, "contiguous"}, {PlacementPolicy::round_robin, "round-robin"},
     {PlacementPolicy::shuffled, "shuffled"}});
inline std::string_view name_of(PlacementPolicy v) { return kPlacementPolicyNames.name(v); }
Placement make_placement(PlacementPolicy policy, int ranks, int layers, int experts,
                         std::uint64_t seed);

}  // namespace moed::placement
