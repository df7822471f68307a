#include "launch/topology_discovery.h"

#include <fmt/format.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <tuple>
#include <utility>

#include "common/error.h"
#include "launch/launch_env.h"  // format_cpu_list

namespace moed::launch {

namespace {

// --- small RAII helpers over hwloc's C API ----------------------------------------

struct BitmapFree {
  void operator()(hwloc_bitmap_s* b) const { hwloc_bitmap_free(b); }
};
using Bitmap = std::unique_ptr<hwloc_bitmap_s, BitmapFree>;

Bitmap new_bitmap() { return Bitmap(hwloc_bitmap_alloc()); }

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

// A fresh topology handed to `setup` (which sets its source and I/O filter and
// loads it); destroyed when `setup` throws.
hwloc_topology_t new_topology(const std::function<void(hwloc_topology_t)>& set_source) {
  hwloc_topology_t topology = nullptr;
  if (hwloc_topology_init(&topology) != 0)
    MOED_THROW(Runtime, "hwloc cannot create a topology: {}", std::strerror(errno));
  try {
    set_source(topology);
  } catch (...) {
    hwloc_topology_destroy(topology);
    throw;
  }
  return topology;
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

// --- islands -----------------------------------------------------------------------

// Connected components of an undirected graph given by `linked(i, j)`.
std::vector<std::vector<int>> components(int n, const std::function<bool(int, int)>& linked) {
  std::vector<int> label(n, -1);
  std::vector<std::vector<int>> out;
  for (int start = 0; start < n; ++start) {
    if (label[start] >= 0) continue;
    const int id = int(out.size());
    out.emplace_back();
    std::vector<int> stack{start};
    label[start] = id;
    while (!stack.empty()) {
      const int v = stack.back();
      stack.pop_back();
      out[id].push_back(v);
      for (int w = 0; w < n; ++w)
        if (label[w] < 0 && linked(v, w)) {
          label[w] = id;
          stack.push_back(w);
        }
    }
    std::sort(out[id].begin(), out[id].end());
  }
  return out;
}

std::string brace_list(const std::vector<int>& members) {
  return "{" + fmt::format("{}", fmt::join(members, ",")) + "}";
}

std::string brace_lists(const std::vector<std::vector<int>>& groups) {
  std::vector<std::string> parts;
  for (const auto& g : groups) parts.push_back(brace_list(g));
  return fmt::format("{}", fmt::join(parts, " "));
}

bool has_nvlink_info(const HostTopology& t) { return !t.gpus.empty() && !t.nvlink_bandwidth.empty(); }

std::vector<std::string> split_commas(std::string_view text) {
  std::vector<std::string> parts;
  for (std::size_t start = 0;;) {
    const std::size_t end = text.find(',', start);
    parts.emplace_back(text.substr(start, end - start));
    if (end == std::string_view::npos) return parts;
    start = end + 1;
  }
}

std::optional<std::string> env_value(const char* name) {
  const char* value = std::getenv(name);
  return value ? std::optional<std::string>(value) : std::nullopt;
}

// Ranks on one machine given different test XMLs are different hosts.
std::string host_key(const RankTopology& r) { return r.host + '\n' + r.topology.host; }

std::string host_label(const RankTopology& r) {
  if (r.topology.host.empty() || r.topology.host == r.host) return r.host;
  return fmt::format("{} (topology of {})", r.host, r.topology.host);
}

std::string plural(std::size_t n, std::string_view one, std::string_view many) {
  return fmt::format("{} {}", n, n == 1 ? one : many);
}

std::string describe_gpu(const GpuInfo& gpu) {
  std::vector<std::string> parts;
  if (!gpu.name.empty()) parts.push_back(gpu.name);
  if (!gpu.model.empty()) parts.push_back(gpu.model);
  if (!gpu.pci_bus_id.empty()) parts.push_back("PCI " + gpu.pci_bus_id);
  parts.push_back(gpu.numa_node >= 0 ? fmt::format("NUMA node {}", gpu.numa_node) : "NUMA node unknown");
  return fmt::format("{}", fmt::join(parts, ", "));
}

// "GPU 1 300 GB/s", or "GPUs 1-7 450 GB/s" for peers of one bandwidth, or "none".
std::string describe_peers(const std::vector<double>& row, int self) {
  std::map<double, std::vector<int>, std::greater<>> peers_of_bandwidth;
  for (std::size_t p = 0; p < row.size(); ++p)
    if (int(p) != self && row[p] > 0) peers_of_bandwidth[row[p]].push_back(int(p));
  if (peers_of_bandwidth.empty()) return "none";
  std::vector<std::string> parts;
  for (const auto& [bandwidth, peers] : peers_of_bandwidth)
    parts.push_back(fmt::format("{} {} {:.0f} GB/s", peers.size() == 1 ? "GPU" : "GPUs",
                                format_cpu_list(peers), bandwidth / 1000.0));
  return fmt::format("{}", fmt::join(parts, ", "));
}

}  // namespace

// --- HwlocTopology -----------------------------------------------------------------

HwlocTopology::HwlocTopology(hwloc_topology_t topology, std::string origin)
    : topology_(topology), origin_(std::move(origin)) {}

HwlocTopology::HwlocTopology(HwlocTopology&& other) noexcept
    : topology_(std::exchange(other.topology_, nullptr)), origin_(std::move(other.origin_)) {}

HwlocTopology& HwlocTopology::operator=(HwlocTopology&& other) noexcept {
  if (this != &other) {
    if (topology_) hwloc_topology_destroy(topology_);
    topology_ = std::exchange(other.topology_, nullptr);
    origin_ = std::move(other.origin_);
  }
  return *this;
}

HwlocTopology::~HwlocTopology() {
  if (topology_) hwloc_topology_destroy(topology_);
}

bool HwlocTopology::is_this_system() const { return hwloc_topology_is_thissystem(topology_) == 1; }

HwlocTopology HwlocTopology::this_machine() {
  // Read HWLOC_XMLFILE here rather than let hwloc do it, so that a bad file is
  // an Input error that names it.
  if (const char* xml = std::getenv("HWLOC_XMLFILE"); xml && *xml) return from_xml_file(xml);
  hwloc_topology_t t = new_topology([](hwloc_topology_t t) {
    hwloc_topology_set_io_types_filter(t, HWLOC_TYPE_FILTER_KEEP_IMPORTANT);
    if (hwloc_topology_load(t) != 0)
      MOED_THROW(Runtime, "hwloc cannot read this machine's topology: {}", std::strerror(errno));
  });
  return HwlocTopology(t, "this machine");
}

HwlocTopology HwlocTopology::from_xml_file(const std::string& path) {
  // hwloc's own message for a missing file is a bare "Invalid argument".
  if (!std::ifstream(path))
    MOED_THROW(Input, "topology XML {}: cannot read it: {}", path, std::strerror(errno));
  hwloc_topology_t t = new_topology([&](hwloc_topology_t t) {
    if (hwloc_topology_set_xml(t, path.c_str()) != 0)
      MOED_THROW(Input, "topology XML {}: hwloc cannot parse it{}", path, kVerboseHint);
    hwloc_topology_set_io_types_filter(t, HWLOC_TYPE_FILTER_KEEP_IMPORTANT);
    if (hwloc_topology_load(t) != 0)
      MOED_THROW(Input, "topology XML {}: hwloc cannot load it: {}{}", path, std::strerror(errno),
                 kVerboseHint);
  });
  return HwlocTopology(t, "XML file " + path);
}

HwlocTopology HwlocTopology::from_xml_string(std::string_view xml, std::string_view origin) {
  // hwloc's buffer length counts the terminating NUL, as its exports do.
  const std::string text(xml);
  hwloc_topology_t t = new_topology([&](hwloc_topology_t t) {
    if (hwloc_topology_set_xmlbuffer(t, text.c_str(), int(text.size() + 1)) != 0)
      MOED_THROW(Input, "topology XML {}: hwloc cannot parse it{}", origin, kVerboseHint);
    hwloc_topology_set_io_types_filter(t, HWLOC_TYPE_FILTER_KEEP_IMPORTANT);
    if (hwloc_topology_load(t) != 0)
      MOED_THROW(Input, "topology XML {}: hwloc cannot load it: {}{}", origin, std::strerror(errno),
                 kVerboseHint);
  });
  return HwlocTopology(t, std::string(origin));
}

// --- reading a host ----------------------------------------------------------------

HostTopology read_host_topology(const HwlocTopology& topology) {
  hwloc_topology_t t = topology.get();
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

std::vector<std::vector<int>> nvlink_islands(const HostTopology& host) {
  const int n = int(host.gpus.size());
  if (n == 0) return {};
  const auto& bw = host.nvlink_bandwidth;
  if (bw.empty()) {
    std::vector<int> all(n);
    for (int g = 0; g < n; ++g) all[g] = g;
    return {all};
  }
  MOED_CHECK(int(bw.size()) == n, "NVLink matrix of {} rows for {} GPUs", bw.size(), n);
  auto at = [&](int i, int j) { return std::size_t(j) < bw[i].size() ? bw[i][j] : 0.0; };
  return components(n, [&](int i, int j) { return i != j && (at(i, j) > 0 || at(j, i) > 0); });
}

RankIslands rank_islands(const std::vector<RankTopology>& ranks) {
  RankIslands out;
  std::map<std::string, int> island_of_key;
  // Each host's GPU islands, computed once per host.
  std::map<std::string, std::vector<int>> gpu_island_of_host;
  bool from_nvlink = false;
  for (const RankTopology& r : ranks) {
    std::string key = host_key(r);
    if (has_nvlink_info(r.topology)) {
      auto [it, fresh] = gpu_island_of_host.try_emplace(key);
      if (fresh) {
        it->second.assign(r.topology.gpus.size(), -1);
        const auto islands = nvlink_islands(r.topology);
        for (std::size_t i = 0; i < islands.size(); ++i)
          for (int g : islands[i]) it->second[g] = int(i);
      }
      const int gpu = gpu_of_rank(r.topology, r.local_rank, r.cuda_visible_devices);
      if (gpu >= 0 && std::size_t(gpu) < it->second.size()) {
        key += fmt::format("\nnvlink island {}", it->second[gpu]);
        from_nvlink = true;
      }
    }
    out.island_of_rank.push_back(island_of_key.try_emplace(key, int(island_of_key.size())).first->second);
  }
  out.source = from_nvlink ? "hwloc" : "hostname";
  return out;
}

// --- descriptions --------------------------------------------------------------------

std::string describe(const HostTopology& host) {
  std::ostringstream out;
  out << (host.host.empty() ? "(unnamed host)" : host.host) << ": "
      << plural(std::size_t(host.numa_nodes), "NUMA node", "NUMA nodes") << ", ";
  if (host.gpus.empty()) {
    out << "no GPU\n";
    return out.str();
  }
  out << plural(host.gpus.size(), "GPU", "GPUs") << ", ";
  const auto islands = nvlink_islands(host);
  if (host.nvlink_bandwidth.empty())
    out << "no NVLink information: one island " << brace_list(islands[0]) << "\n";
  else
    out << plural(islands.size(), "NVLink island", "NVLink islands") << " " << brace_lists(islands) << "\n";
  for (std::size_t g = 0; g < host.gpus.size(); ++g) {
    out << "  GPU " << g << ": " << describe_gpu(host.gpus[g]);
    if (!host.nvlink_bandwidth.empty())
      out << "; NVLink: " << describe_peers(host.nvlink_bandwidth[g], int(g));
    out << "\n";
  }
  return out.str();
}

std::string describe_job(const std::vector<RankTopology>& ranks, const RankIslands& islands) {
  std::map<int, std::vector<int>> members;
  for (std::size_t r = 0; r < islands.island_of_rank.size(); ++r)
    members[islands.island_of_rank[r]].push_back(int(r));
  std::vector<std::vector<int>> groups;
  for (auto& [island, rs] : members) groups.push_back(rs);

  std::vector<std::size_t> first_rank_of_host;  // one rank per host, in rank order
  std::set<std::string> seen;
  for (std::size_t r = 0; r < ranks.size(); ++r)
    if (seen.insert(host_key(ranks[r])).second) first_rank_of_host.push_back(r);

  std::ostringstream out;
  out << plural(ranks.size(), "rank", "ranks") << " on " << plural(first_rank_of_host.size(), "host", "hosts")
      << ", " << plural(groups.size(), "island", "islands") << " (from " << islands.source
      << "): " << brace_lists(groups) << "\n";
  for (std::size_t r = 0; r < ranks.size(); ++r) {
    const RankTopology& rank = ranks[r];
    const int gpu = gpu_of_rank(rank.topology, rank.local_rank, rank.cuda_visible_devices);
    out << "  rank " << r << ": " << host_label(rank) << ", local rank " << rank.local_rank << ", ";
    if (gpu >= 0)
      out << "GPU " << gpu << " (" << describe_gpu(rank.topology.gpus[std::size_t(gpu)]) << ")";
    else
      out << (rank.topology.gpus.empty() ? "no GPU" : "GPU unknown");
    if (rank.cuda_visible_devices) out << " (CUDA_VISIBLE_DEVICES=" << *rank.cuda_visible_devices << ")";
    if (r < islands.island_of_rank.size()) out << ", island " << islands.island_of_rank[r];
    out << "\n";
  }
  for (std::size_t r : first_rank_of_host) out << describe(ranks[r].topology);
  return out.str();
}

// --- the all-gather form -------------------------------------------------------------

std::string encode_rank_topology(const RankTopology& rank) {
  const HostTopology& t = rank.topology;
  nlohmann::json gpus = nlohmann::json::array();
  for (const GpuInfo& g : t.gpus)
    gpus.push_back({{"name", g.name}, {"model", g.model}, {"pci", g.pci_bus_id}, {"numa", g.numa_node}});
  return nlohmann::json{
      {"host", rank.host},
      {"local_rank", rank.local_rank},
      {"cuda_visible_devices",
       rank.cuda_visible_devices ? nlohmann::json(*rank.cuda_visible_devices) : nlohmann::json(nullptr)},
      {"topology",
       {{"host", t.host}, {"numa_nodes", t.numa_nodes}, {"gpus", gpus}, {"nvlink", t.nvlink_bandwidth}}}}
      .dump();
}

RankTopology decode_rank_topology(std::string_view text) {
  try {
    const nlohmann::json j = nlohmann::json::parse(text);
    RankTopology rank;
    rank.host = j.at("host").get<std::string>();
    rank.local_rank = j.at("local_rank").get<int>();
    if (const auto& cvd = j.at("cuda_visible_devices"); !cvd.is_null())
      rank.cuda_visible_devices = cvd.get<std::string>();
    const nlohmann::json& t = j.at("topology");
    HostTopology& host = rank.topology;
    host.host = t.at("host").get<std::string>();
    host.numa_nodes = t.at("numa_nodes").get<int>();
    for (const auto& g : t.at("gpus"))
      host.gpus.push_back({g.at("name").get<std::string>(), g.at("model").get<std::string>(),
                           g.at("pci").get<std::string>(), g.at("numa").get<int>()});
    host.nvlink_bandwidth = t.at("nvlink").get<std::vector<std::vector<double>>>();
    MOED_CHECK(host.nvlink_bandwidth.empty() || host.nvlink_bandwidth.size() == host.gpus.size(),
               "NVLink matrix of {} rows for {} GPUs", host.nvlink_bandwidth.size(), host.gpus.size());
    return rank;
  } catch (const nlohmann::json::exception& e) {
    MOED_THROW(Internal, "unreadable encoded rank topology ({}): {}", e.what(), text.substr(0, 200));
  }
}

// --- binding ---------------------------------------------------------------------------

int gpu_of_rank(const HostTopology& host, int local_rank,
                const std::optional<std::string>& cuda_visible_devices) {
  const int gpus = int(host.gpus.size());
  if (gpus == 0) return -1;
  const int lr = std::max(0, local_rank);
  if (!cuda_visible_devices) return lr % gpus;
  if (cuda_visible_devices->empty()) return -1;
  const std::vector<std::string> visible = split_commas(*cuda_visible_devices);
  const std::string& entry = visible[std::size_t(lr) % visible.size()];
  int index = -1;
  const auto [end, ec] = std::from_chars(entry.data(), entry.data() + entry.size(), index);
  if (ec != std::errc() || end != entry.data() + entry.size() || index < 0 || index >= gpus) return -1;
  return index;
}

NumaChoice choose_numa_node(const HwlocTopology& topology, const HostTopology& host, int local_rank,
                            const std::optional<std::string>& cuda_visible_devices) {
  hwloc_topology_t t = topology.get();
  std::vector<int> with_cores;  // OS indexes of the NUMA nodes that have cores
  for (hwloc_obj_t n = hwloc_get_next_obj_by_type(t, HWLOC_OBJ_NUMANODE, nullptr); n;
       n = hwloc_get_next_obj_by_type(t, HWLOC_OBJ_NUMANODE, n))
    if (n->cpuset && !hwloc_bitmap_iszero(n->cpuset)) with_cores.push_back(int(n->os_index));
  std::sort(with_cores.begin(), with_cores.end());

  std::string gpu_note;
  if (const int gpu = gpu_of_rank(host, local_rank, cuda_visible_devices); gpu >= 0) {
    const GpuInfo& g = host.gpus[std::size_t(gpu)];
    const std::string which =
        fmt::format("GPU {}{}", gpu, g.pci_bus_id.empty() ? "" : " (" + g.pci_bus_id + ")");
    if (g.numa_node >= 0 && std::binary_search(with_cores.begin(), with_cores.end(), g.numa_node))
      return {g.numa_node, "NUMA node of " + which};
    gpu_note = g.numa_node < 0 ? "; " + which + "'s node unknown" : "; " + which + "'s node has no cores";
  } else if (!host.gpus.empty() && cuda_visible_devices && !cuda_visible_devices->empty()) {
    gpu_note = "; its GPU in CUDA_VISIBLE_DEVICES=" + *cuda_visible_devices + " is not in hwloc's list";
  }
  if (with_cores.empty()) return {-1, "no NUMA node with cores" + gpu_note};
  const int index = std::max(0, local_rank) % int(with_cores.size());
  return {with_cores[std::size_t(index)],
          fmt::format("local rank {} mod {}{}", local_rank,
                      plural(with_cores.size(), "NUMA node with cores", "NUMA nodes with cores"), gpu_note)};
}

BindResult bind_to_gpu_numa(const HwlocTopology& topology, int local_rank) {
  hwloc_topology_t t = topology.get();
  const NumaChoice choice =
      choose_numa_node(topology, read_host_topology(topology), local_rank, env_value("CUDA_VISIBLE_DEVICES"));
  BindResult result;
  result.numa_node = choice.numa_node;
  if (choice.numa_node < 0) {
    result.description = "not bound: " + choice.why;
    return result;
  }
  hwloc_obj_t node = hwloc_get_numanode_obj_by_os_index(t, unsigned(choice.numa_node));
  const std::string cores = list_string(node->cpuset);
  const std::string target = fmt::format("NUMA node {} (cores {}; {})", choice.numa_node, cores, choice.why);
  if (!topology.is_this_system()) {
    // hwloc's binding calls succeed without doing anything on such a topology.
    result.description = fmt::format("not bound: the topology is from {}, not this machine; would bind to {}",
                                     topology.origin(), target);
    return result;
  }
  Bitmap current = new_bitmap();
  if (current && hwloc_get_cpubind(t, current.get(), HWLOC_CPUBIND_PROCESS) == 0 &&
      !hwloc_bitmap_iszero(current.get()) && hwloc_bitmap_isincluded(current.get(), node->cpuset)) {
    result.bound = true;
    result.description =
        fmt::format("already bound to cores {} within {}", list_string(current.get()), target);
    return result;
  }
  if (hwloc_set_cpubind(t, node->cpuset, HWLOC_CPUBIND_PROCESS) != 0) {
    result.description = fmt::format("not bound to {}: {}", target, std::strerror(errno));
    return result;
  }
  result.bound = true;
  result.description = "bound to " + target;
  return result;
}

BindResult bind_to_gpu_numa(int local_rank) {
  try {
    return bind_to_gpu_numa(HwlocTopology::this_machine(), local_rank);
  } catch (const Error& e) {
    return {false, -1, std::string("not bound: ") + e.what()};
  }
}

}  // namespace moed::launch
