// What a run asks of a placement's sharded experts beyond the file's own
// validity: S divides the canonical F-chunks ([experts].ffn_chunks; see
// kernels/cpu/expert_ffn.h), so each shard holds whole chunks and the sum
// of its partial outputs is the whole expert's bit for bit; and the shards
// of each copy share one island, so a token's row crosses to them once.
#pragma once

#include <string>

#include "placement/placement.h"
#include "placement/topology.h"

namespace moed::placement {

// Throws an Input error prefixed with `origin`, naming the layer and expert.
void check_shards(const Placement& p, int ffn_chunks, const Topology& topology, const std::string& origin);

}  // namespace moed::placement
