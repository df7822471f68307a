#include "launch/rank_topology_codec.h"

#include <nlohmann/json.hpp>

#include "common/error.h"

namespace moed::launch {

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

}  // namespace moed::launch
