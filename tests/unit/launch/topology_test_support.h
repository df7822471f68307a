// Helpers shared by the topology tests of tests/unit/launch/: the test
// topologies of tests/data/topology/ (see tests/data/README.md) and small
// hand-made hosts and jobs. Header only.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "launch/host_topology.h"
#include "launch/hwloc_topology.h"

namespace moed::launch::test_topology {

using Islands = std::vector<std::vector<int>>;

inline std::string topology_file(const std::string& name) {
  return std::string(MOED_TEST_DATA_DIR) + "/topology/" + name;
}

inline HostTopology load(const std::string& name) {
  return read_host_topology(HwlocTopology::from_xml_file(topology_file(name)));
}

inline bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

// Ranks of one host, local ranks 0..n-1, in rank order.
inline void add_host(std::vector<RankTopology>& ranks, const std::string& host, const HostTopology& t,
                     int n) {
  for (int l = 0; l < n; ++l) ranks.push_back({host, l, t});
}

// A host of one NUMA node and no GPU.
inline HostTopology cpu_only_host(const std::string& name) {
  HostTopology t;
  t.host = name;
  t.numa_nodes = 1;
  return t;
}

}  // namespace moed::launch::test_topology
