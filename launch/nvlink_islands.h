// NVLink islands from plain data (host_topology.h), without hwloc: a host's
// GPUs grouped by NVLink, and the job's ranks grouped by the islands of their
// GPUs.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "launch/host_topology.h"

namespace moed::launch {

// GPUs grouped into NVLink islands: the connected components of the graph
// whose edges are the pairs with bandwidth > 0 (either direction). Islands are
// ascending lists of GPU indices, ordered by their first GPU. A host whose
// GPUs all connect (directly or through NVSwitches) is one island; a host
// without NVLink information is one island of all its GPUs; a host without
// GPUs has no island.
std::vector<std::vector<int>> nvlink_islands(const HostTopology& host);

// The index in host.gpus (hwloc's list, PCI order) of a physical GPU as
// RankGpu::physical names it (rank_gpu.h). -1 when there is none, when it is
// not on the host, or when it is a UUID or MIG name (which cannot be matched
// with hwloc's list).
int host_gpu_index(const HostTopology& host, std::string_view physical_gpu);

struct RankIslands {
  std::vector<int> island_of_rank;  // dense, numbered in rank order of first appearance
  std::string source;               // "hwloc" when some rank's island came from NVLink, else "hostname"
};

// The job's islands. A host is named by host_key(). A rank's GPU is
// gpu_of_rank()'s among the GPUs its CUDA_VISIBLE_DEVICES leaves visible
// (visible_gpu_count()), found in hwloc's list with host_gpu_index(). Ranks
// whose GPUs lie in one NVLink island of one host share an island; ranks on a
// host with no GPU or no NVLink information, and ranks whose GPU is unknown,
// form one island per host.
RankIslands rank_islands(const std::vector<RankTopology>& ranks);

// What tells a rank's host from another: the launcher's host name together
// with its topology's HostName, so that ranks given different test XMLs on one
// machine count as different hosts.
std::string host_key(const RankTopology& rank);

}  // namespace moed::launch
