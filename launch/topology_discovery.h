// Topology discovery with hwloc: a host's GPUs, the NUMA node each GPU hangs
// off, and the NVLink bandwidth between them; from that, the NVLink islands of
// a host and of the whole job, and the binding of a rank to its GPU's NUMA node.
//
// hwloc is read once per process (HwlocTopology, from this machine or from an
// XML file); everything after read_host_topology() is plain data and pure
// functions that the tests drive with test topologies (tests/data/topology/).
//
// Where GPUs and NVLink come from: hwloc's NVML backend records each GPU as an
// OS device ("nvml0", GPU) and the links as the "NVLinkBandwidth" distances
// matrix; its CUDA backend adds "cuda0" (co-processor). Debian's hwloc has
// neither plugin, so on a real Debian host a GPU is an NVIDIA PCI device
// (vendor 0x10de, class VGA or 3D) with no OS device and no matrix: the host
// then has GPUs but no NVLink information, and forms one island.
#pragma once

#include <hwloc.h>

#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace moed::launch {

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

  HwlocTopology(HwlocTopology&& other) noexcept;
  HwlocTopology& operator=(HwlocTopology&& other) noexcept;
  HwlocTopology(const HwlocTopology&) = delete;
  HwlocTopology& operator=(const HwlocTopology&) = delete;
  ~HwlocTopology();

  hwloc_topology_t get() const { return topology_; }
  // Whether binding through this topology acts on this machine: false for a
  // topology loaded from XML (hwloc's binding calls then do nothing).
  bool is_this_system() const;
  // "this machine" or "XML file PATH": where the topology came from.
  const std::string& origin() const { return origin_; }

 private:
  HwlocTopology(hwloc_topology_t topology, std::string origin);
  hwloc_topology_t topology_ = nullptr;
  std::string origin_;
};

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

// The host's GPUs, NUMA nodes and NVLink matrix as hwloc knows them.
HostTopology read_host_topology(const HwlocTopology& topology);

// GPUs grouped into NVLink islands: the connected components of the graph
// whose edges are the pairs with bandwidth > 0 (either direction). Islands are
// ascending lists of GPU indices, ordered by their first GPU. A host whose
// GPUs all connect (directly or through NVSwitches) is one island; a host
// without NVLink information is one island of all its GPUs; a host without
// GPUs has no island.
std::vector<std::vector<int>> nvlink_islands(const HostTopology& host);

// The index in host.gpus of the GPU a rank uses, as moed and launch/moed-rank
// pick it: entry (local rank mod n) of CUDA_VISIBLE_DEVICES when it is set
// (its entries name physical GPUs; an index is one in PCI order, a UUID or MIG
// name cannot be matched with hwloc's list and gives -1; "" hides every GPU),
// else GPU (local rank mod GPUs). -1 when the rank has no GPU or it is unknown.
int gpu_of_rank(const HostTopology& host, int local_rank,
                const std::optional<std::string>& cuda_visible_devices);

// What one rank contributes to the job's islands.
struct RankTopology {
  std::string host;  // the launcher's host name (LaunchInfo::host)
  int local_rank = 0;
  // As read on that rank; ranks of one host agree.
  HostTopology topology;
  // The rank's CUDA_VISIBLE_DEVICES (BindingFacts::cuda_visible_devices), if set.
  std::optional<std::string> cuda_visible_devices = {};
};

struct RankIslands {
  std::vector<int> island_of_rank;  // dense, numbered in rank order of first appearance
  std::string source;               // "hwloc" when some rank's island came from NVLink, else "hostname"
};

// The job's islands. A host is named by the launcher's host name together with
// its topology's HostName (so that ranks given different test XMLs on one
// machine count as different hosts). A rank's GPU is gpu_of_rank()'s. Ranks
// whose GPUs lie in one NVLink island of one host share an island; ranks on a
// host with no GPU or no NVLink information, and ranks whose GPU is unknown,
// form one island per host.
RankIslands rank_islands(const std::vector<RankTopology>& ranks);

// Several lines: the host, its NUMA nodes, each GPU (name, model, PCI bus id,
// NUMA node, NVLink peers and bandwidth) and the NVLink islands.
std::string describe(const HostTopology& host);

// For `moed --print-topology`: the islands and their source, one line per rank
// (host, local rank, GPU, island), then describe() of each host once.
std::string describe_job(const std::vector<RankTopology>& ranks, const RankIslands& islands);

// A rank's RankTopology as one string and back, for the start-up all-gather
// (ControlChannel::all_gather_strings). decode_rank_topology throws an
// Internal error on a string that encode_rank_topology did not make.
std::string encode_rank_topology(const RankTopology& rank);
RankTopology decode_rank_topology(std::string_view text);

// The NUMA node a rank binds to: that of its GPU (gpu_of_rank()); when it has
// no GPU, or the GPU or its node is unknown or the node has no cores, the
// (local rank mod N)-th of the N NUMA nodes that have cores (in OS index
// order), as launch/moed-rank does. -1 when no node has cores. `why` says
// which rule chose it.
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

// Binds the calling process (all its threads: HWLOC_CPUBIND_PROCESS) to the
// cores of the NUMA node choose_numa_node() picks, with the process's
// CUDA_VISIBLE_DEVICES. A process already bound
// within those cores (launch/moed-rank binds with hwloc-bind before exec) is
// left as it is. Never throws: failures (a cgroup without those cores, a
// topology from XML) are reported in the result and the process runs as it was.
BindResult bind_to_gpu_numa(const HwlocTopology& topology, int local_rank);
// The same on this machine's topology (HwlocTopology::this_machine()).
BindResult bind_to_gpu_numa(int local_rank);

}  // namespace moed::launch
