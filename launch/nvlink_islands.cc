#include "launch/nvlink_islands.h"

#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <functional>
#include <map>

#include "common/error.h"
#include "launch/rank_gpu.h"

namespace moed::launch {

namespace {

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

bool has_nvlink_info(const HostTopology& t) { return !t.gpus.empty() && !t.nvlink_bandwidth.empty(); }

}  // namespace

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

int host_gpu_index(const HostTopology& host, std::string_view physical_gpu) {
  int index = -1;
  const char* end = physical_gpu.data() + physical_gpu.size();
  const auto [stop, ec] = std::from_chars(physical_gpu.data(), end, index);
  if (ec != std::errc() || stop != end || index < 0 || index >= int(host.gpus.size())) return -1;
  return index;
}

std::string host_key(const RankTopology& rank) { return rank.host + '\n' + rank.topology.host; }

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
      const int visible = visible_gpu_count(int(r.topology.gpus.size()), r.cuda_visible_devices);
      const int gpu =
          host_gpu_index(r.topology, gpu_of_rank(r.local_rank, visible, r.cuda_visible_devices).physical);
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

}  // namespace moed::launch
