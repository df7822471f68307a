#include "launch/topology_description.h"

#include <fmt/format.h>

#include <functional>
#include <map>
#include <set>
#include <sstream>
#include <string_view>

#include "common/int_ranges.h"
#include "launch/rank_gpu.h"

namespace moed::launch {

namespace {

std::string brace_list(const std::vector<int>& members) {
  return "{" + fmt::format("{}", fmt::join(members, ",")) + "}";
}

std::string brace_lists(const std::vector<std::vector<int>>& groups) {
  std::vector<std::string> parts;
  for (const auto& g : groups) parts.push_back(brace_list(g));
  return fmt::format("{}", fmt::join(parts, " "));
}

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
    parts.push_back(fmt::format("{} {} {:.0f} GB/s", peers.size() == 1 ? "GPU" : "GPUs", format_ranges(peers),
                                bandwidth / 1000.0));
  return fmt::format("{}", fmt::join(parts, ", "));
}

}  // namespace

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
    const HostTopology& host = rank.topology;
    const int visible = visible_gpu_count(int(host.gpus.size()), rank.cuda_visible_devices);
    const int gpu =
        host_gpu_index(host, gpu_of_rank(rank.local_rank, visible, rank.cuda_visible_devices).physical);
    out << "  rank " << r << ": " << host_label(rank) << ", local rank " << rank.local_rank << ", ";
    if (gpu >= 0)
      out << "GPU " << gpu << " (" << describe_gpu(host.gpus[std::size_t(gpu)]) << ")";
    else
      out << (host.gpus.empty() ? "no GPU" : "GPU unknown");
    if (rank.cuda_visible_devices) out << " (CUDA_VISIBLE_DEVICES=" << *rank.cuda_visible_devices << ")";
    if (r < islands.island_of_rank.size()) out << ", island " << islands.island_of_rank[r];
    out << "\n";
  }
  for (std::size_t r : first_rank_of_host) out << describe(ranks[r].topology);
  return out.str();
}

}  // namespace moed::launch
