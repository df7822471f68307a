// Binding a rank to its GPU's NUMA node: the choice of node (from the plain
// host data and the NUMA nodes that have cores) and the binding itself, both
// through the hwloc reader (hwloc_topology.h).
#pragma once

#include <optional>
#include <string>

#include "launch/host_topology.h"
#include "launch/hwloc_topology.h"

namespace moed::launch {

// The NUMA node a rank binds to: that of its GPU (gpu_of_rank(), found in
// hwloc's list as rank_islands() does); when it has no GPU, or the GPU or its
// node is unknown or the node has no cores, the (local rank mod N)-th of the N
// NUMA nodes that have cores (in OS index order), as launch/moed-rank does. -1
// when no node has cores. `why` says which rule chose it.
struct NumaChoice {
  int numa_node = -1;
  std::string why;
};
NumaChoice choose_numa_node(const HwlocTopology& topology, const HostTopology& host, int local_rank,
                            const std::optional<std::string>& cuda_visible_devices = std::nullopt);

struct BindResult {
  bool bound = false;       // the process runs within the node's cores (bound now, or before start)
  int numa_node = -1;       // the node chosen; -1 when none
  std::string description;  // one phrase for the start-up log line
};

// Binds the calling process (all its threads) to the cores of the NUMA node
// choose_numa_node() picks, with the process's CUDA_VISIBLE_DEVICES. A process
// already bound within those cores (launch/moed-rank binds with hwloc-bind
// before exec) is left as it is. Never throws: failures (a cgroup without those
// cores, a topology from XML) are reported in the result and the process runs
// as it was.
BindResult bind_to_gpu_numa(const HwlocTopology& topology, int local_rank);
// The same on this machine's topology (HwlocTopology::this_machine()).
BindResult bind_to_gpu_numa(int local_rank);

}  // namespace moed::launch
