// The hwloc reader: the one place that calls hwloc. It loads a topology once
// per process (this machine, or an XML file for the tests), reads the host's
// GPUs, NUMA nodes and NVLink matrix into plain data (host_topology.h), and
// binds the process to a NUMA node's cores. Everything else in launch/ works on
// that plain data and never sees hwloc.h.
//
// Where GPUs and NVLink come from: hwloc's NVML backend records each GPU as an
// OS device ("nvml0", GPU) and the links as the "NVLinkBandwidth" distances
// matrix; its CUDA backend adds "cuda0" (co-processor). Debian's hwloc has
// neither plugin, so on a real Debian host a GPU is an NVIDIA PCI device
// (vendor 0x10de, class VGA or 3D) with no OS device and no matrix: the host
// then has GPUs but no NVLink information, and forms one island.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "launch/host_topology.h"

struct hwloc_topology;  // hwloc's handle (hwloc_topology_t points to one)

namespace moed::launch {

// Destroys an hwloc topology; defined beside the hwloc calls.
struct HwlocTopologyDestroy {
  void operator()(hwloc_topology* topology) const;
};

// An hwloc topology, loaded and owned (RAII; move-only). I/O objects are kept
// with HWLOC_TYPE_FILTER_KEEP_IMPORTANT: without it hwloc drops the PCI
// devices, the GPU OS devices and, with them, the NVLink matrix.
class HwlocTopology {
 public:
  // This machine, as hwloc sees it. HWLOC_XMLFILE, when set, names an XML file
  // to load instead (hwloc's own convention, used by the multi-rank tests to
  // give each rank a test topology); that file is then read as from_xml_file().
  // Runtime error when hwloc cannot load the machine.
  static HwlocTopology this_machine();
  // An XML file (lstopo's or hwloc-annotate's output). Input error naming the
  // file when it cannot be read or hwloc refuses it.
  static HwlocTopology from_xml_file(const std::string& path);
  // An XML document in memory; `origin` names it in errors (Input).
  static HwlocTopology from_xml_string(std::string_view xml, std::string_view origin = "XML string");

  // Whether binding through this topology acts on this machine: false for a
  // topology loaded from XML (hwloc's binding calls then do nothing).
  bool is_this_system() const;
  // "this machine" or "XML file PATH": where the topology came from.
  const std::string& origin() const { return origin_; }

  // The OS indexes of the NUMA nodes that have cores, ascending.
  std::vector<int> numa_nodes_with_cores() const;
  // The cores of NUMA node `os_index` in the kernel's cpulist form
  // ("0-7,16-23"); "?" when hwloc cannot say.
  std::string numa_node_cores(int os_index) const;
  // The cores this process (all its threads) is bound to, in cpulist form, when
  // they lie within NUMA node `os_index`'s cores; nullopt otherwise or unknown.
  std::optional<std::string> process_bound_within(int os_index) const;
  // Binds this process (all its threads: HWLOC_CPUBIND_PROCESS) to the cores
  // of NUMA node `os_index`. "" when bound, else why not (the OS's reason).
  std::string bind_process_to(int os_index) const;

 private:
  using Handle = std::unique_ptr<hwloc_topology, HwlocTopologyDestroy>;
  HwlocTopology(Handle topology, std::string origin);
  friend HostTopology read_host_topology(const HwlocTopology& topology);

  Handle topology_;
  std::string origin_;
};

// The host's GPUs, NUMA nodes and NVLink matrix as hwloc knows them.
HostTopology read_host_topology(const HwlocTopology& topology);

}  // namespace moed::launch
