// From a current placement to a new one with as few bytes moved as possible.
//
// A new placement from the optimiser has arbitrary island and rank labels.
// relabel_to_minimise_moves() renames its islands (an assignment problem over
// islands) and then, inside each island, its ranks (one over ranks), so that
// the most slots stay where they are. moves() lists the slots that still
// differ; limit_moves() (placement/move_limit.h) keeps the N whose predicted
// gain per byte is best, applied so that the result is a valid placement.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "placement/placement.h"
#include "placement/topology.h"

namespace moed::placement {

// One slot to fill: a copy of (layer, expert) goes to rank `to`, read from
// rank `from` (a rank that holds it in the old placement), and the slot of
// that expert on `drop` is released (-1: nothing released, a new replica).
// For a split expert the slot is shard `shard` of `shards` of its copy
// `copy` (placement.h), moved whole from its holder (from = drop) to a rank
// that holds no shard of it.
//
// A whole expert split into shards (`cut`): one move per shard of each copy,
// its bytes cut from a whole copy on `from` (which may be `to` itself: a
// holder that keeps a shard), and one release (to = -1) per holder that keeps
// no shard. The moves of one such split apply together or not at all
// (apply_moves).
struct Move {
  int layer = 0, expert = 0;
  int from = -1, to = -1, drop = -1;
  int shard = 0, shards = 1;
  bool cut = false;
  int copy = 0;
  bool operator==(const Move&) const = default;
};

// The bytes a move of one shard of `shards` carries (1: a whole expert): its
// weights in the format the ranks hold them, scales and biases included.
using SlotBytes = std::function<std::size_t(int shards)>;

// Renames the islands and ranks of `next` (a relabelling of the topology's
// islands among themselves and of ranks within an island) to keep the most
// slots of `current` in place. Both placements have the same shape, and every
// island of `topology` has the same number of ranks (else islands are kept).
Placement relabel_to_minimise_moves(const Placement& current, const Placement& next,
                                    const Topology& topology);

// The slots of `next` that `current` lacks, per layer and expert, each paired
// with a slot released where an expert leaves a rank. Shards move one by
// one; a whole expert that `next` splits is cut into its shards (`cut`). An
// Input error where `next` merges, splits differently or holds in another
// number of copies an expert that `current` splits (a migration moves
// shards, it does not re-split a split expert) or where a shard would land
// on a rank that holds another shard of its expert until the end.
std::vector<Move> moves(const Placement& current, const Placement& next);

// Applies a subset of moves to `current` (a move is applied as a whole:
// adding the slot on `to`, releasing `drop`; the cut moves of one expert all
// together: an Internal error if some are missing).
Placement apply_moves(const Placement& current, const std::vector<Move>& chosen);

// Human lines, one per move: "layer 3 expert 17: rank 2 -> rank 9 (drops rank 2)".
std::string describe_moves(const std::vector<Move>& moves);

}  // namespace moed::placement
