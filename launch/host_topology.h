// A host's GPUs, NUMA nodes and NVLink matrix as plain data: what
// read_host_topology() (hwloc_topology.h) reads once per process, what the
// ranks all-gather at start-up (rank_topology_codec.h), and what the islands
// (nvlink_islands.h), the descriptions and the NUMA binding are computed from.
// The tests build these by hand or read them from tests/data/topology/.
#pragma once

#include <optional>
#include <string>
#include <vector>

namespace moed::launch {

struct GpuInfo {
  // The GPU's OS device ("nvml0", else "cuda0", else another such as "card1"),
  // or "" when hwloc knows only its PCI device.
  std::string name;
  std::string model;       // "NVIDIA H100 80GB HBM3" when hwloc knows it, else ""
  std::string pci_bus_id;  // "0000:1a:00.0"; "" for an OS device without a PCI device
  int numa_node = -1;      // OS index of the GPU's NUMA node; -1 when unknown or ambiguous
};

struct HostTopology {
  std::string host;    // the topology's HostName (hwloc sets it; test XMLs name their host); "" if none
  int numa_nodes = 0;  // NUMA nodes of the host, with or without cores
  // NVIDIA GPUs in PCI bus order, which is CUDA's and nvidia-smi's order on a
  // host of identical GPUs and the order launch/moed-rank uses: GPU i is the
  // GPU of local rank i.
  std::vector<GpuInfo> gpus;
  // nvlink_bandwidth[i][j]: NVLink bandwidth from GPU i to GPU j in MB/s, as
  // hwloc reports it, direct plus through NVSwitches (or any other non-GPU
  // object of the matrix: for each, the smaller of the two links); 0 on the
  // diagonal and between unlinked GPUs. Empty when hwloc has no NVLink matrix
  // for these GPUs ("unknown", not "no links").
  std::vector<std::vector<double>> nvlink_bandwidth;
};

// What one rank contributes to the job's islands.
struct RankTopology {
  std::string host;  // the launcher's host name (LaunchInfo::host)
  int local_rank = 0;
  // As read on that rank; ranks of one host agree.
  HostTopology topology;
  // The rank's CUDA_VISIBLE_DEVICES (BindingFacts::cuda_visible_devices), if set.
  std::optional<std::string> cuda_visible_devices = {};
};

}  // namespace moed::launch
