// What a rank learns from the launcher that started it: which launcher, its
// rank on the host (local rank) and how many ranks share the host. Open MPI's
// mpirun and Slurm's srun each export their own variables.
//
// And where the rank runs, for its start-up log line: the CPU cores it may run
// on, the NUMA node(s) those cores belong to, and the GPU it uses. The facts are
// gathered by probe_binding() (sched_getaffinity, sysfs, the environment) and
// described by pure functions that the tests drive directly.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace moed::launch {

struct LaunchInfo {
  std::string launcher;  // "mpirun", "slurm" or "none"
  int local_rank = 0;
  int local_size = 1;
  std::string host;
};

using EnvLookup = std::function<std::optional<std::string>(const char*)>;

// From the process environment, or from `env` (tests). Malformed values are
// ignored in favour of the next source, never fatal.
LaunchInfo detect_launch(const EnvLookup& env = {});

// What describe_binding() needs to know about the running process.
struct BindingFacts {
  std::vector<int> cpus;  // the CPUs this process may run on, ascending; empty = unknown
  // CUDA devices this process sees; 0 when none or when the daemon serves on
  // CPU. moed uses device (local rank mod gpu_count), see gpu_of_rank().
  int gpu_count = 0;
  // CUDA_VISIBLE_DEVICES as set by the launcher (Slurm's gres, moed-rank
  // --set-cuda-visible-devices, the operator); its entries name the physical GPUs.
  std::optional<std::string> cuda_visible_devices;
  // numa_cpus[n]: the CPUs of NUMA node n (sysfs node<n>/cpulist); empty when
  // the host exposes no NUMA information. A node without CPUs has an empty list.
  std::vector<std::vector<int>> numa_cpus;
};

// "0-3,8,10-11" for {0,1,2,3,8,10,11}: the kernel's cpulist format. Empty for
// an empty list. The input need not be sorted; duplicates are ignored.
std::string format_cpu_list(std::vector<int> cpus);

// The reverse, as in sysfs's cpulist files ("0-3,8\n"); nullopt when malformed.
std::optional<std::vector<int>> parse_cpu_list(std::string_view text);

// The NUMA nodes whose CPUs intersect `cpus`, ascending.
std::vector<int> numa_nodes_of(const std::vector<int>& cpus,
                               const std::vector<std::vector<int>>& numa_cpus);

// One phrase for the start-up log line, e.g.
//   "cores 0-15 (NUMA node 1), GPU 3 of 8"
//   "cores 0-1 (NUMA node 0), no GPU"
//   "cores 0-7 (NUMA nodes 0-1), GPU 0 of 1 = physical GPU 5 (CUDA_VISIBLE_DEVICES=5)"
std::string describe_binding(const LaunchInfo& where, const BindingFacts& facts);

// Reads the facts of this process: sched_getaffinity, CUDA_VISIBLE_DEVICES
// (from `env` when given), and the NUMA nodes' cpulists under `sysfs_root`.
// `gpu_count` comes from the caller (the CUDA runtime's device count, or 0).
// Never fails: what cannot be read is left unknown.
BindingFacts probe_binding(int gpu_count, const EnvLookup& env = {},
                           const std::string& sysfs_root = "/sys");

}  // namespace moed::launch
