// Placement files: TOML, versioned, validated on load, written atomically.
//
//   format = "moed-placement-v1"
//   epoch = 3
//   ranks = 4
//   layers = 2
//   experts = 8
//   [[layer]]            # one table per layer, in order
//   slots = [[0], [0], [1], [1], [2], [2], [3], [3, 1]]   # expert e -> ranks with a slot
//   model_layer = 3      # (a model with dense layers) the model's number of this MoE layer
//
// An expert split into shards (tensor sharding) is written as a table in
// its place: {shards = [2, 3]} (shard 0 on rank 2, shard 1 on rank 3).
#pragma once

#include <string>

#include "common/layer_numbers.h"
#include "placement/placement.h"

namespace moed::placement {

// A model with dense layers numbers its MoE layers apart from their index
// (common/layer_numbers.h): a placement written with `numbers` names each
// [[layer]]'s model layer (model_layer = 3), and one read with such
// `numbers` must name the same (a file that names none is taken as it is;
// without them, the names are not checked).
//
// Throws Input errors naming the file and the layer/expert at fault.
Placement read_placement_file(const std::string& path, const LayerNumbers& numbers = {});
Placement parse_placement(const std::string& text, const std::string& origin, const LayerNumbers& numbers = {});
std::string format_placement(const Placement& p, const LayerNumbers& numbers = {});
// Temp file, fsync, rename: a reader sees the old file or the new one, never half.
void write_placement_file(const Placement& p, const std::string& path, const LayerNumbers& numbers = {});

// The placement must fit the run: same rank, layer and expert counts.
void check_placement_shape(const Placement& p, int ranks, int layers, int experts,
                           const std::string& origin);

}  // namespace moed::placement
