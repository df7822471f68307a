// A rank's RankTopology (host_topology.h) as one JSON string and back, for the
// start-up all-gather (ControlChannel::all_gather_strings).
#pragma once

#include <string>
#include <string_view>

#include "launch/host_topology.h"

namespace moed::launch {

std::string encode_rank_topology(const RankTopology& rank);
// Throws an Internal error on a string that encode_rank_topology did not make.
RankTopology decode_rank_topology(std::string_view text);

}  // namespace moed::launch
