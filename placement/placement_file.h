// Placement files: TOML, versioned, validated on load, written atomically.
//
//   format = "moed-placement-v1"
//   epoch = 3
//   ranks = 4
//   layers = 2
//   experts = 8
//   [[layer]]            # one table per layer, in order
//   slots = [[0], [0], [1], [1], [2], [2], [3], [3, 1]]   # expert e -> ranks with a slot
//
// An expert split into shards (tensor sharding) is written as a table in
// its place: {shards = [2, 3]} (shard 0 on rank 2, shard 1 on rank 3).
#pragma once

#include <string>

#include "placement/placement.h"

namespace moed::placement {

// Throws Input errors naming the file and the layer/expert at fault.
Placement read_placement_file(const std::string& path);
Placement parse_placement(const std::string& text, const std::string& origin);
std::string format_placement(const Placement& p);
// Temp file, fsync, rename: a reader sees the old file or the new one, never half.
void write_placement_file(const Placement& p, const std::string& path);

// The placement must fit the run: same rank, layer and expert counts.
void check_placement_shape(const Placement& p, int ranks, int layers, int experts,
                           const std::string& origin);

}  // namespace moed::placement
