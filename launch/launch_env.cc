#include "launch/launch_env.h"

#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <set>
#include <sstream>

#include "common/int_ranges.h"
#include "launch/rank_gpu.h"

namespace moed::launch {

namespace {

std::optional<int> read_int(const EnvLookup& env, const char* name) {
  auto text = env(name);
  if (!text) return std::nullopt;
  int value = 0;
  auto [end, ec] = std::from_chars(text->data(), text->data() + text->size(), value);
  if (ec != std::errc() || end != text->data() + text->size() || value < 0) return std::nullopt;
  return value;
}

EnvLookup process_env() {
  return [](const char* name) -> std::optional<std::string> {
    const char* v = std::getenv(name);
    return v ? std::optional<std::string>(v) : std::nullopt;
  };
}

std::optional<int> parse_nonnegative(std::string_view text) {
  int value = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc() || end != text.data() + text.size() || value < 0) return std::nullopt;
  return value;
}

std::vector<std::string> split(std::string_view text, char sep) {
  std::vector<std::string> parts;
  std::size_t start = 0;
  while (true) {
    std::size_t end = text.find(sep, start);
    parts.emplace_back(text.substr(start, end - start));
    if (end == std::string_view::npos) return parts;
    start = end + 1;
  }
}

// The CPUs this process may run on. The kernel refuses a mask smaller than its
// own (EINVAL), so grow it until it fits.
std::vector<int> affinity_cpus() {
  for (int ncpus = 1024; ncpus <= (1 << 20); ncpus *= 4) {
    cpu_set_t* set = CPU_ALLOC(ncpus);
    if (!set) return {};
    const std::size_t bytes = CPU_ALLOC_SIZE(ncpus);
    CPU_ZERO_S(bytes, set);
    if (::sched_getaffinity(0, bytes, set) == 0) {
      std::vector<int> cpus;
      for (int c = 0; c < ncpus; ++c)
        if (CPU_ISSET_S(c, bytes, set)) cpus.push_back(c);
      CPU_FREE(set);
      return cpus;
    }
    const int err = errno;
    CPU_FREE(set);
    if (err != EINVAL) return {};
  }
  return {};
}

std::optional<std::string> read_small_file(const std::string& path) {
  std::ifstream in(path);
  if (!in) return std::nullopt;
  return std::string(std::istreambuf_iterator<char>(in), {});
}

}  // namespace

LaunchInfo detect_launch(const EnvLookup& lookup) {
  EnvLookup env = lookup ? lookup : process_env();
  LaunchInfo info;
  char host[256] = {};
  if (::gethostname(host, sizeof host - 1) == 0) info.host = host;

  // mpirun's variables first: inside a Slurm allocation mpirun is still the launcher.
  if (auto lr = read_int(env, "OMPI_COMM_WORLD_LOCAL_RANK")) {
    info.launcher = "mpirun";
    info.local_rank = *lr;
    info.local_size = read_int(env, "OMPI_COMM_WORLD_LOCAL_SIZE").value_or(1);
  } else if (auto lid = read_int(env, "SLURM_LOCALID")) {
    info.launcher = "slurm";
    info.local_rank = *lid;
    // SLURM_TASKS_PER_NODE reads like "4(x2)": the leading count holds for even layouts.
    if (auto tpn = env("SLURM_TASKS_PER_NODE")) info.local_size = std::max(1, std::atoi(tpn->c_str()));
  } else {
    info.launcher = "none";
  }
  if (info.local_size < info.local_rank + 1) info.local_size = info.local_rank + 1;
  return info;
}

std::string format_cpu_list(std::vector<int> cpus) { return format_ranges(std::move(cpus)); }

std::optional<std::vector<int>> parse_cpu_list(std::string_view text) {
  while (!text.empty() && (text.back() == '\n' || text.back() == ' ')) text.remove_suffix(1);
  std::vector<int> cpus;
  if (text.empty()) return cpus;  // a memory-only NUMA node has an empty cpulist
  for (const std::string& range : split(text, ',')) {
    const auto dash = range.find('-');
    const auto first = parse_nonnegative(std::string_view(range).substr(0, dash));
    const auto last = dash == std::string::npos
                          ? first
                          : parse_nonnegative(std::string_view(range).substr(dash + 1));
    if (!first || !last || *last < *first || *last - *first > (1 << 20)) return std::nullopt;
    for (int c = *first; c <= *last; ++c) cpus.push_back(c);
  }
  std::sort(cpus.begin(), cpus.end());
  cpus.erase(std::unique(cpus.begin(), cpus.end()), cpus.end());
  return cpus;
}

std::vector<int> numa_nodes_of(const std::vector<int>& cpus,
                               const std::vector<std::vector<int>>& numa_cpus) {
  const std::set<int> mine(cpus.begin(), cpus.end());
  std::vector<int> nodes;
  for (std::size_t n = 0; n < numa_cpus.size(); ++n)
    if (std::any_of(numa_cpus[n].begin(), numa_cpus[n].end(), [&](int c) { return mine.count(c); }))
      nodes.push_back(int(n));
  return nodes;
}

std::string describe_binding(const LaunchInfo& where, const BindingFacts& facts) {
  std::ostringstream out;
  if (facts.cpus.empty())
    out << "cores unknown";
  else
    out << (facts.cpus.size() == 1 ? "core " : "cores ") << format_cpu_list(facts.cpus);
  if (!facts.cpus.empty() && !facts.numa_cpus.empty()) {
    const std::vector<int> nodes = numa_nodes_of(facts.cpus, facts.numa_cpus);
    if (nodes.size() == 1)
      out << " (NUMA node " << nodes[0] << ")";
    else if (nodes.size() > 1)
      out << " (NUMA nodes " << format_cpu_list(nodes) << ")";
  }

  const std::string cvd_note =
      facts.cuda_visible_devices
          ? " (CUDA_VISIBLE_DEVICES=" +
                (facts.cuda_visible_devices->empty() ? std::string("\"\"") : *facts.cuda_visible_devices) +
                ")"
          : std::string();
  const RankGpu gpu = gpu_of_rank(where.local_rank, facts.gpu_count, facts.cuda_visible_devices);
  if (gpu.device < 0) {
    out << ", no GPU" << cvd_note;
    return out.str();
  }
  out << ", GPU " << gpu.device << " of " << facts.gpu_count;
  if (facts.cuda_visible_devices) {
    if (!gpu.physical.empty()) out << " = physical GPU " << gpu.physical;
    out << cvd_note;
  }
  return out.str();
}

BindingFacts probe_binding(int gpu_count, const EnvLookup& lookup, const std::string& sysfs_root) {
  EnvLookup env = lookup ? lookup : process_env();
  BindingFacts facts;
  facts.cpus = affinity_cpus();
  facts.gpu_count = std::max(0, gpu_count);
  facts.cuda_visible_devices = env("CUDA_VISIBLE_DEVICES");
  // node/online lists the node numbers ("0-1", or sparse as "0,8"); a node
  // missing from it keeps an empty CPU list.
  const std::string nodes_dir = sysfs_root + "/devices/system/node/";
  auto online = read_small_file(nodes_dir + "online");
  auto nodes = online ? parse_cpu_list(*online) : std::nullopt;
  if (!nodes || nodes->empty() || nodes->back() > 4095) return facts;
  facts.numa_cpus.resize(std::size_t(nodes->back()) + 1);
  for (int n : *nodes) {
    auto text = read_small_file(nodes_dir + "node" + std::to_string(n) + "/cpulist");
    auto cpus = text ? parse_cpu_list(*text) : std::nullopt;
    if (!cpus) {  // an unreadable topology: say nothing rather than something wrong
      facts.numa_cpus.clear();
      return facts;
    }
    facts.numa_cpus[std::size_t(n)] = std::move(*cpus);
  }
  return facts;
}

}  // namespace moed::launch
