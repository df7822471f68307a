// Text descriptions of the topology, from plain data (host_topology.h): a
// host's GPUs, NUMA nodes and islands, and the job's view for
// `moed --print-topology`.
#pragma once

#include <string>
#include <vector>

#include "launch/host_topology.h"
#include "launch/nvlink_islands.h"

namespace moed::launch {

// Several lines: the host, its NUMA nodes, each GPU (name, model, PCI bus id,
// NUMA node, NVLink peers and bandwidth) and the NVLink islands.
std::string describe(const HostTopology& host);

// For `moed --print-topology`: the islands and their source, one line per rank
// (host, local rank, GPU, island), then describe() of each host once.
std::string describe_job(const std::vector<RankTopology>& ranks, const RankIslands& islands);

}  // namespace moed::launch
