#include "launch/hwloc_topology.h"

#include <fmt/format.h>
#include <hwloc.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <map>
#include <tuple>
#include <utility>

#include "common/error.h"

namespace moed::launch {

namespace {

// --- small RAII helpers over hwloc's C API ----------------------------------------

struct BitmapFree {
  void operator()(hwloc_bitmap_s* b) const { hwloc_bitmap_free(b); }
};
using Bitmap = std::unique_ptr<hwloc_bitmap_s, BitmapFree>;

// "0-7,16-23": hwloc's list form, the kernel's cpulist format.
std::string list_string(hwloc_const_bitmap_t set) {
  char* text = nullptr;
  if (hwloc_bitmap_list_asprintf(&text, set) < 0 || !text) return "?";
  std::string out(text);
  std::free(text);
  return out;
}

// The topology's "NVLinkBandwidth" matrix, released with the object.
class NvlinkMatrix {
 public:
  explicit NvlinkMatrix(hwloc_topology_t topology) : topology_(topology) {
    unsigned count = 1;  // room for one; hwloc says how many exist
    if (hwloc_distances_get_by_name(topology, "NVLinkBandwidth", &count, &matrix_, 0) != 0 || count == 0)
      matrix_ = nullptr;
  }
  ~NvlinkMatrix() {
    if (matrix_) hwloc_distances_release(topology_, matrix_);
  }
  NvlinkMatrix(const NvlinkMatrix&) = delete;
  NvlinkMatrix& operator=(const NvlinkMatrix&) = delete;

  const hwloc_distances_s* get() const { return matrix_; }

 private:
  hwloc_topology_t topology_;
  hwloc_distances_s* matrix_ = nullptr;
};

// hwloc keeps its XML parser's messages to itself unless asked.
constexpr const char* kVerboseHint = " (HWLOC_XML_VERBOSE=1 shows hwloc's messages)";

using Handle = std::unique_ptr<hwloc_topology, HwlocTopologyDestroy>;

// A fresh topology handed to `set_source` (which sets its source and I/O
// filter and loads it); destroyed when `set_source` throws.
Handle new_topology(const std::function<void(hwloc_topology_t)>& set_source) {
  hwloc_topology_t raw = nullptr;
  if (hwloc_topology_init(&raw) != 0)
    MOED_THROW(Runtime, "hwloc cannot create a topology: {}", std::strerror(errno));
  Handle topology(raw);
  set_source(topology.get());
  return topology;
}

hwloc_obj_t numa_node_obj(hwloc_topology_t topology, int os_index) {
  return os_index < 0 ? nullptr : hwloc_get_numanode_obj_by_os_index(topology, unsigned(os_index));
}

// --- GPUs ------------------------------------------------------------------------

bool is_nvidia_gpu_pci(hwloc_obj_t obj) {
  if (obj->type != HWLOC_OBJ_PCI_DEVICE) return false;
  const auto& pci = obj->attr->pcidev;
  // Class 0x0300 (VGA) or 0x0302 (3D controller); NVSwitches (0x0680) and the
  // GPUs' audio functions (0x0403) are other classes.
  return pci.vendor_id == 0x10de && (pci.class_id == 0x0300 || pci.class_id == 0x0302);
}

bool is_gpu_osdev(hwloc_obj_t obj) {
  return obj->type == HWLOC_OBJ_OS_DEVICE &&
         (obj->attr->osdev.type == HWLOC_OBJ_OSDEV_GPU || obj->attr->osdev.type == HWLOC_OBJ_OSDEV_COPROC);
}

bool starts_with(const char* name, std::string_view prefix) {
  return name && std::string_view(name).substr(0, prefix.size()) == prefix;
}

// NVML's name first (it is the one in the NVLink matrix), then CUDA's, then any.
int name_preference(const char* name) {
  if (starts_with(name, "nvml")) return 0;
  if (starts_with(name, "cuda")) return 1;
  return 2;
}

std::string pci_bus_id(hwloc_obj_t pci) {
  const auto& a = pci->attr->pcidev;
  return fmt::format("{:04x}:{:02x}:{:02x}.{:x}", unsigned(a.domain), unsigned(a.bus), unsigned(a.dev),
                     unsigned(a.func));
}

// The OS index of the NUMA node an I/O object hangs off: hwloc attaches I/O
// objects below the smallest CPU-side object that holds them, whose nodeset
// names its NUMA nodes. -1 when that object spans several nodes (or none).
int numa_node_of(hwloc_topology_t topology, hwloc_obj_t io) {
  hwloc_obj_t ancestor = hwloc_get_non_io_ancestor_obj(topology, io);
  if (!ancestor || !ancestor->nodeset || hwloc_bitmap_weight(ancestor->nodeset) != 1) return -1;
  return hwloc_bitmap_first(ancestor->nodeset);
}

std::string info(hwloc_obj_t obj, const char* name) {
  const char* value = obj ? hwloc_obj_get_info_by_name(obj, name) : nullptr;
  return value ? value : "";
}

// A GPU found, with the hwloc object that stands for it in the NVLink matrix's
// ancestry: its PCI device, or its OS device when it has no PCI device.
struct FoundGpu {
  GpuInfo info;
  hwloc_obj_t anchor = nullptr;
};

// The GPU OS devices below an NVIDIA PCI device: the preferred one names it.
FoundGpu gpu_of_pci_device(hwloc_topology_t topology, hwloc_obj_t pci) {
  FoundGpu gpu;
  gpu.anchor = pci;
  gpu.info.pci_bus_id = pci_bus_id(pci);
  gpu.info.numa_node = numa_node_of(topology, pci);
  hwloc_obj_t best = nullptr;
  for (hwloc_obj_t child = pci->io_first_child; child; child = child->next_sibling)
    if (is_gpu_osdev(child) && (!best || name_preference(child->name) < name_preference(best->name)))
      best = child;
  if (best) gpu.info.name = best->name ? best->name : "";
  gpu.info.model = info(best, "GPUModel");
  return gpu;
}

bool below_nvidia_gpu_pci(hwloc_obj_t obj) {
  for (hwloc_obj_t up = obj->parent; up && !up->cpuset; up = up->parent)
    if (is_nvidia_gpu_pci(up)) return true;
  return false;
}

// The NVML or CUDA OS devices that no NVIDIA PCI device holds (an XML from a
// host whose PCI devices were filtered out). NVML and CUDA each list every GPU,
// so only one of the two sets is taken: NVML's when it has any.
std::vector<FoundGpu> gpus_without_pci(hwloc_topology_t topology) {
  std::vector<hwloc_obj_t> nvml, cuda;
  for (hwloc_obj_t os = hwloc_get_next_osdev(topology, nullptr); os;
       os = hwloc_get_next_osdev(topology, os)) {
    if (!is_gpu_osdev(os) || below_nvidia_gpu_pci(os)) continue;
    if (starts_with(os->name, "nvml")) nvml.push_back(os);
    if (starts_with(os->name, "cuda")) cuda.push_back(os);
  }
  std::vector<hwloc_obj_t>& chosen = nvml.empty() ? cuda : nvml;
  // "nvml10" after "nvml9": by name length, then name.
  std::sort(chosen.begin(), chosen.end(), [](hwloc_obj_t a, hwloc_obj_t b) {
    const std::string_view x(a->name), y(b->name);
    return x.size() != y.size() ? x.size() < y.size() : x < y;
  });
  std::vector<FoundGpu> gpus;
  for (hwloc_obj_t os : chosen) {
    FoundGpu gpu;
    gpu.anchor = os;
    gpu.info.name = os->name;
    gpu.info.model = info(os, "GPUModel");
    gpu.info.numa_node = numa_node_of(topology, os);
    gpus.push_back(std::move(gpu));
  }
  return gpus;
}

std::vector<FoundGpu> find_gpus(hwloc_topology_t topology) {
  std::vector<FoundGpu> gpus;
  for (hwloc_obj_t pci = hwloc_get_next_pcidev(topology, nullptr); pci;
       pci = hwloc_get_next_pcidev(topology, pci))
    if (is_nvidia_gpu_pci(pci)) gpus.push_back(gpu_of_pci_device(topology, pci));
  std::sort(gpus.begin(), gpus.end(), [](const FoundGpu& a, const FoundGpu& b) {
    const auto &x = a.anchor->attr->pcidev, &y = b.anchor->attr->pcidev;
    return std::tie(x.domain, x.bus, x.dev, x.func) < std::tie(y.domain, y.bus, y.dev, y.func);
  });
  for (FoundGpu& gpu : gpus_without_pci(topology)) gpus.push_back(std::move(gpu));
  return gpus;
}

// --- the NVLink matrix -------------------------------------------------------------

// Which GPU a matrix object is: the GPU whose anchor is the object or one of
// its I/O ancestors (the NVML OS device sits below the GPU's PCI device); -1
// for any other object (an NVSwitch, a POWER CPU).
int gpu_index_of(hwloc_obj_t obj, const std::map<hwloc_obj_t, int>& gpu_of_anchor) {
  for (hwloc_obj_t up = obj; up; up = up->parent) {
    if (auto it = gpu_of_anchor.find(up); it != gpu_of_anchor.end()) return it->second;
    if (up->cpuset) break;  // left the I/O tree
  }
  return -1;
}

// GPU x GPU bandwidth from hwloc's matrix, which may hold other objects too:
// with NVSwitches, NVML reports GPU-switch links and no GPU-GPU link, so a
// path through one non-GPU object counts with the smaller of its two links.
std::vector<std::vector<double>> gpu_bandwidth(const hwloc_distances_s& m,
                                               const std::vector<FoundGpu>& gpus) {
  std::map<hwloc_obj_t, int> gpu_of_anchor;
  for (std::size_t g = 0; g < gpus.size(); ++g) gpu_of_anchor[gpus[g].anchor] = int(g);
  const unsigned n = m.nbobjs;
  std::vector<int> gpu_of(n);
  std::vector<unsigned> hops;  // matrix indices of the non-GPU objects
  bool any_gpu = false;
  for (unsigned i = 0; i < n; ++i) {
    gpu_of[i] = m.objs[i] ? gpu_index_of(m.objs[i], gpu_of_anchor) : -1;
    if (gpu_of[i] >= 0)
      any_gpu = true;
    else if (m.objs[i])
      hops.push_back(i);
  }
  if (!any_gpu) return {};  // a matrix about other devices: nothing known of these GPUs

  auto value = [&](unsigned i, unsigned j) { return double(m.values[std::size_t(i) * n + j]); };
  std::vector<std::vector<double>> bw(gpus.size(), std::vector<double>(gpus.size(), 0.0));
  for (unsigned i = 0; i < n; ++i) {
    for (unsigned j = 0; j < n; ++j) {
      const int a = gpu_of[i], b = gpu_of[j];
      if (a < 0 || b < 0 || a == b) continue;  // the diagonal holds a local figure, not a link
      double through = 0;
      for (unsigned s : hops) through += std::min(value(i, s), value(s, j));
      bw[a][b] += value(i, j) + through;
    }
  }
  return bw;
}

}  // namespace

void HwlocTopologyDestroy::operator()(hwloc_topology* topology) const { hwloc_topology_destroy(topology); }

// --- loading -----------------------------------------------------------------------

HwlocTopology::HwlocTopology(Handle topology, std::string origin)
    : topology_(std::move(topology)), origin_(std::move(origin)) {}

bool HwlocTopology::is_this_system() const { return hwloc_topology_is_thissystem(topology_.get()) == 1; }

HwlocTopology HwlocTopology::this_machine() {
  // Read HWLOC_XMLFILE here rather than let hwloc do it, so that a bad file is
  // an Input error that names it.
  if (const char* xml = std::getenv("HWLOC_XMLFILE"); xml && *xml) return from_xml_file(xml);
  Handle t = new_topology([](hwloc_topology_t t) {
    hwloc_topology_set_io_types_filter(t, HWLOC_TYPE_FILTER_KEEP_IMPORTANT);
    if (hwloc_topology_load(t) != 0)
      MOED_THROW(Runtime, "hwloc cannot read this machine's topology: {}", std::strerror(errno));
  });
  return HwlocTopology(std::move(t), "this machine");
}

HwlocTopology HwlocTopology::from_xml_file(const std::string& path) {
  // hwloc's own message for a missing file is a bare "Invalid argument".
  if (!std::ifstream(path))
    MOED_THROW(Input, "topology XML {}: cannot read it: {}", path, std::strerror(errno));
  Handle t = new_topology([&](hwloc_topology_t t) {
    if (hwloc_topology_set_xml(t, path.c_str()) != 0)
      MOED_THROW(Input, "topology XML {}: hwloc cannot parse it{}", path, kVerboseHint);
    hwloc_topology_set_io_types_filter(t, HWLOC_TYPE_FILTER_KEEP_IMPORTANT);
    if (hwloc_topology_load(t) != 0)
      MOED_THROW(Input, "topology XML {}: hwloc cannot load it: {}{}", path, std::strerror(errno),
                 kVerboseHint);
  });
  return HwlocTopology(std::move(t), "XML file " + path);
}

HwlocTopology HwlocTopology::from_xml_string(std::string_view xml, std::string_view origin) {
  // hwloc's buffer length counts the terminating NUL, as its exports do.
  const std::string text(xml);
  Handle t = new_topology([&](hwloc_topology_t t) {
    if (hwloc_topology_set_xmlbuffer(t, text.c_str(), int(text.size() + 1)) != 0)
      MOED_THROW(Input, "topology XML {}: hwloc cannot parse it{}", origin, kVerboseHint);
    hwloc_topology_set_io_types_filter(t, HWLOC_TYPE_FILTER_KEEP_IMPORTANT);
    if (hwloc_topology_load(t) != 0)
      MOED_THROW(Input, "topology XML {}: hwloc cannot load it: {}{}", origin, std::strerror(errno),
                 kVerboseHint);
  });
  return HwlocTopology(std::move(t), std::string(origin));
}

// --- reading a host ----------------------------------------------------------------

HostTopology read_host_topology(const HwlocTopology& topology) {
  hwloc_topology_t t = topology.topology_.get();
  HostTopology host;
  host.host = info(hwloc_get_root_obj(t), "HostName");
  host.numa_nodes = std::max(0, hwloc_get_nbobjs_by_type(t, HWLOC_OBJ_NUMANODE));
  const std::vector<FoundGpu> gpus = find_gpus(t);
  for (const FoundGpu& gpu : gpus) host.gpus.push_back(gpu.info);
  if (!gpus.empty()) {
    NvlinkMatrix matrix(t);
    if (matrix.get()) host.nvlink_bandwidth = gpu_bandwidth(*matrix.get(), gpus);
  }
  return host;
}

// --- NUMA nodes and binding ----------------------------------------------------------

std::vector<int> HwlocTopology::numa_nodes_with_cores() const {
  hwloc_topology_t t = topology_.get();
  std::vector<int> with_cores;
  for (hwloc_obj_t n = hwloc_get_next_obj_by_type(t, HWLOC_OBJ_NUMANODE, nullptr); n;
       n = hwloc_get_next_obj_by_type(t, HWLOC_OBJ_NUMANODE, n))
    if (n->cpuset && !hwloc_bitmap_iszero(n->cpuset)) with_cores.push_back(int(n->os_index));
  std::sort(with_cores.begin(), with_cores.end());
  return with_cores;
}

std::string HwlocTopology::numa_node_cores(int os_index) const {
  const hwloc_obj_t node = numa_node_obj(topology_.get(), os_index);
  return node && node->cpuset ? list_string(node->cpuset) : "?";
}

std::optional<std::string> HwlocTopology::process_bound_within(int os_index) const {
  const hwloc_obj_t node = numa_node_obj(topology_.get(), os_index);
  if (!node || !node->cpuset) return std::nullopt;
  const Bitmap current(hwloc_bitmap_alloc());
  if (current && hwloc_get_cpubind(topology_.get(), current.get(), HWLOC_CPUBIND_PROCESS) == 0 &&
      !hwloc_bitmap_iszero(current.get()) && hwloc_bitmap_isincluded(current.get(), node->cpuset))
    return list_string(current.get());
  return std::nullopt;
}

std::string HwlocTopology::bind_process_to(int os_index) const {
  const hwloc_obj_t node = numa_node_obj(topology_.get(), os_index);
  if (!node || !node->cpuset) return fmt::format("hwloc has no NUMA node {}", os_index);
  if (hwloc_set_cpubind(topology_.get(), node->cpuset, HWLOC_CPUBIND_PROCESS) != 0)
    return std::strerror(errno);
  return "";
}

}  // namespace moed::launch
