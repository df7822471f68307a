#include "launch/numa_binding.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdlib>
#include <vector>

#include "common/error.h"
#include "launch/nvlink_islands.h"
#include "launch/rank_gpu.h"

namespace moed::launch {

namespace {

std::optional<std::string> env_value(const char* name) {
  const char* value = std::getenv(name);
  return value ? std::optional<std::string>(value) : std::nullopt;
}

}  // namespace

NumaChoice choose_numa_node(const HwlocTopology& topology, const HostTopology& host, int local_rank,
                            const std::optional<std::string>& cuda_visible_devices) {
  const std::vector<int> with_cores = topology.numa_nodes_with_cores();

  std::string gpu_note;
  const int visible = visible_gpu_count(int(host.gpus.size()), cuda_visible_devices);
  if (const int gpu = host_gpu_index(host, gpu_of_rank(local_rank, visible, cuda_visible_devices).physical);
      gpu >= 0) {
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
  const std::size_t n = with_cores.size();
  const int index = std::max(0, local_rank) % int(n);
  return {with_cores[std::size_t(index)], fmt::format("local rank {} mod {} NUMA node{} with cores{}",
                                                      local_rank, n, n == 1 ? "" : "s", gpu_note)};
}

BindResult bind_to_gpu_numa(const HwlocTopology& topology, int local_rank) {
  const NumaChoice choice =
      choose_numa_node(topology, read_host_topology(topology), local_rank, env_value("CUDA_VISIBLE_DEVICES"));
  BindResult result;
  result.numa_node = choice.numa_node;
  if (choice.numa_node < 0) {
    result.description = "not bound: " + choice.why;
    return result;
  }
  const std::string target = fmt::format("NUMA node {} (cores {}; {})", choice.numa_node,
                                         topology.numa_node_cores(choice.numa_node), choice.why);
  if (!topology.is_this_system()) {
    // hwloc's binding calls succeed without doing anything on such a topology.
    result.description = fmt::format("not bound: the topology is from {}, not this machine; would bind to {}",
                                     topology.origin(), target);
    return result;
  }
  if (const auto cores = topology.process_bound_within(choice.numa_node)) {
    result.bound = true;
    result.description = fmt::format("already bound to cores {} within {}", *cores, target);
    return result;
  }
  if (const std::string why_not = topology.bind_process_to(choice.numa_node); !why_not.empty()) {
    result.description = fmt::format("not bound to {}: {}", target, why_not);
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
