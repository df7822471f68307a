// NVLink islands of a host (from the test topologies and from hand-made
// matrices) and of a job: ranks grouped by their GPUs' islands, else by host.
#include "launch/nvlink_islands.h"

#include <gtest/gtest.h>

#include <string>
#include <utility>
#include <vector>

#include "tests/unit/launch/topology_test_support.h"

namespace moed::launch {
namespace {

using test_topology::add_host;
using test_topology::cpu_only_host;
using test_topology::Islands;
using test_topology::load;

// A matrix of `n` GPUs with the given undirected links (bandwidth 1000 MB/s).
HostTopology linked_gpus(int n, const std::vector<std::pair<int, int>>& links) {
  HostTopology t;
  t.host = "h";
  t.numa_nodes = 1;
  t.gpus.resize(std::size_t(n));
  t.nvlink_bandwidth.assign(std::size_t(n), std::vector<double>(std::size_t(n), 0.0));
  for (auto [a, b] : links) t.nvlink_bandwidth[a][b] = t.nvlink_bandwidth[b][a] = 1000;
  return t;
}

// --- a host's islands ---------------------------------------------------------------

TEST(NvlinkIslands, NvlinkPairsGiveTwoIslandsOfTwoGpusPerHost) {
  EXPECT_EQ(nvlink_islands(load("2x4-nvlink-pairs-host1.xml")), (Islands{{0, 1}, {2, 3}}));
  EXPECT_EQ(nvlink_islands(load("2x4-nvlink-pairs-host2.xml")), (Islands{{0, 1}, {2, 3}}));
}

TEST(NvlinkIslands, IslandsAreConnectedComponentsOfTheLinks) {
  EXPECT_EQ(nvlink_islands(linked_gpus(4, {{0, 1}, {1, 2}})), (Islands{{0, 1, 2}, {3}}));
  EXPECT_EQ(nvlink_islands(linked_gpus(4, {{3, 0}, {2, 1}})), (Islands{{0, 3}, {1, 2}}));
  EXPECT_EQ(nvlink_islands(linked_gpus(3, {})), (Islands{{0}, {1}, {2}})) << "a known matrix without links";
  HostTopology one_way = linked_gpus(2, {});
  one_way.nvlink_bandwidth[1][0] = 25000;
  EXPECT_EQ(nvlink_islands(one_way), (Islands{{0, 1}})) << "a link in one direction joins both GPUs";
  EXPECT_TRUE(nvlink_islands(cpu_only_host("")).empty());
}

// --- the job's islands ---------------------------------------------------------------

TEST(NvlinkIslands, TwoHostJobOfNvlinkPairsGivesFourIslands) {
  std::vector<RankTopology> ranks;
  add_host(ranks, "host1", load("2x4-nvlink-pairs-host1.xml"), 4);
  add_host(ranks, "host2", load("2x4-nvlink-pairs-host2.xml"), 4);
  const RankIslands islands = rank_islands(ranks);
  EXPECT_EQ(islands.island_of_rank, (std::vector<int>{0, 0, 1, 1, 2, 2, 3, 3}));
  EXPECT_EQ(islands.source, "hwloc");
}

// The multi-rank tests run both "hosts" on one machine, each rank with its
// host's XML (HWLOC_XMLFILE): one launcher host name, local ranks 0-7.
TEST(NvlinkIslands, TopologyHostNamesSeparateHostsEmulatedOnOneMachine) {
  std::vector<RankTopology> ranks;
  const HostTopology h1 = load("2x4-nvlink-pairs-host1.xml"), h2 = load("2x4-nvlink-pairs-host2.xml");
  for (int l = 0; l < 8; ++l) ranks.push_back({"vm", l, l < 4 ? h1 : h2});
  EXPECT_EQ(rank_islands(ranks).island_of_rank, (std::vector<int>{0, 0, 1, 1, 2, 2, 3, 3}));
}

TEST(NvlinkIslands, NvswitchJobIsOneIslandPerHost) {
  std::vector<RankTopology> ranks;
  add_host(ranks, "a", load("nvswitch-8gpu.xml"), 8);
  add_host(ranks, "b", load("nvswitch-8gpu.xml"), 8);
  const RankIslands islands = rank_islands(ranks);
  EXPECT_EQ(islands.island_of_rank, (std::vector<int>{0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1}))
      << "one XML on two launcher hosts: still two hosts";
  EXPECT_EQ(islands.source, "hwloc");
}

TEST(NvlinkIslands, HostsWithoutNvlinkOrGpusGiveOneIslandPerHost) {
  std::vector<RankTopology> ranks;
  add_host(ranks, "p1", load("no-nvlink-4gpu.xml"), 4);
  add_host(ranks, "cpu1", cpu_only_host("cpu1"), 2);
  add_host(ranks, "p2", load("no-nvlink-4gpu.xml"), 4);
  const RankIslands islands = rank_islands(ranks);
  EXPECT_EQ(islands.island_of_rank, (std::vector<int>{0, 0, 0, 0, 1, 1, 2, 2, 2, 2}));
  EXPECT_EQ(islands.source, "hostname");
}

TEST(NvlinkIslands, MixedJobNumbersIslandsInRankOrder) {
  std::vector<RankTopology> ranks;
  add_host(ranks, "p1", load("no-nvlink-4gpu.xml"), 2);
  add_host(ranks, "host1", load("2x4-nvlink-pairs-host1.xml"), 4);
  const RankIslands islands = rank_islands(ranks);
  EXPECT_EQ(islands.island_of_rank, (std::vector<int>{0, 0, 1, 1, 2, 2}));
  EXPECT_EQ(islands.source, "hwloc");
}

TEST(NvlinkIslands, RanksUseTheGpuThatCudaVisibleDevicesNames) {
  // Two ranks given GPUs 2 and 3 by Slurm share the island {2,3}; a rank
  // whose GPU is unknown forms the host's island.
  const HostTopology t = load("2x4-nvlink-pairs-host1.xml");
  std::vector<RankTopology> ranks{
      {"host1", 0, t, "2"}, {"host1", 1, t, "3"}, {"host1", 2, t, "GPU-8e1d7c6a"}};
  EXPECT_EQ(rank_islands(ranks).island_of_rank, (std::vector<int>{0, 0, 1}));
}

TEST(NvlinkIslands, MoreRanksThanGpusShareTheGpusIslands) {
  std::vector<RankTopology> ranks;
  add_host(ranks, "host1", load("2x4-nvlink-pairs-host1.xml"), 8);  // local rank 5 -> GPU 1
  EXPECT_EQ(rank_islands(ranks).island_of_rank, (std::vector<int>{0, 0, 1, 1, 0, 0, 1, 1}));
}

}  // namespace
}  // namespace moed::launch
