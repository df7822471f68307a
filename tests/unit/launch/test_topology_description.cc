// The text descriptions: a host's GPUs, NUMA nodes and islands, and the job's
// view for `moed --print-topology`.
#include "launch/topology_description.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "tests/unit/launch/topology_test_support.h"

namespace moed::launch {
namespace {

using test_topology::add_host;
using test_topology::contains;
using test_topology::cpu_only_host;
using test_topology::load;

TEST(TopologyDescription, DescribeNamesGpusNumaNodesAndIslands) {
  const std::string d = describe(load("2x4-nvlink-pairs-host1.xml"));
  for (const char* part :
       {"host1: 2 NUMA nodes, 4 GPUs, 2 NVLink islands {0,1} {2,3}",
        "GPU 0: nvml0, NVIDIA H100 NVL, PCI 0000:1a:00.0, NUMA node 0; NVLink: GPU 1 300 GB/s",
        "GPU 3: nvml3, NVIDIA H100 NVL, PCI 0000:bd:00.0, NUMA node 1; NVLink: GPU 2 300 GB/s"})
    EXPECT_TRUE(contains(d, part)) << "missing '" << part << "' in:\n" << d;

  const std::string dgx = describe(load("nvswitch-8gpu.xml"));
  EXPECT_TRUE(contains(dgx, "dgx1: 2 NUMA nodes, 8 GPUs, 1 NVLink island {0,1,2,3,4,5,6,7}")) << dgx;
  EXPECT_TRUE(contains(dgx,
                       "GPU 1: nvml1, NVIDIA H100 80GB HBM3, PCI 0000:2a:00.0, NUMA node 0; "
                       "NVLink: GPUs 0,2-7 450 GB/s"))
      << dgx;

  const std::string pcie = describe(load("no-nvlink-4gpu.xml"));
  EXPECT_TRUE(contains(pcie, "pcie1: 2 NUMA nodes, 4 GPUs, no NVLink information: one island {0,1,2,3}"))
      << pcie;
  EXPECT_EQ(describe(cpu_only_host("cpu1")), "cpu1: 1 NUMA node, no GPU\n");
}

TEST(TopologyDescription, DescribeJobListsIslandsRanksAndHosts) {
  std::vector<RankTopology> ranks;
  add_host(ranks, "host1", load("2x4-nvlink-pairs-host1.xml"), 4);
  add_host(ranks, "host2", load("2x4-nvlink-pairs-host2.xml"), 4);
  const std::string d = describe_job(ranks, rank_islands(ranks));
  for (const char* part : {"8 ranks on 2 hosts, 4 islands (from hwloc): {0,1} {2,3} {4,5} {6,7}\n",
                           "rank 5: host2, local rank 1, GPU 1 (nvml1, NVIDIA H100 NVL, PCI 0000:3c:00.0, "
                           "NUMA node 0), island 2\n",
                           "host1: 2 NUMA nodes", "host2: 2 NUMA nodes"})
    EXPECT_TRUE(contains(d, part)) << "missing '" << part << "' in:\n" << d;
}

TEST(TopologyDescription, DescribeJobNamesTheGpuCudaVisibleDevicesGives) {
  const HostTopology t = load("2x4-nvlink-pairs-host1.xml");
  std::vector<RankTopology> ranks{
      {"host1", 0, t, "2"}, {"host1", 1, t, "3"}, {"host1", 2, t, "GPU-8e1d7c6a"}};
  const std::string d = describe_job(ranks, rank_islands(ranks));
  EXPECT_TRUE(contains(d,
                       "rank 1: host1, local rank 1, GPU 3 (nvml3, NVIDIA H100 NVL, PCI 0000:bd:00.0, NUMA "
                       "node 1) (CUDA_VISIBLE_DEVICES=3), island 0\n"))
      << d;
  EXPECT_TRUE(contains(d, "rank 2: host1, local rank 2, GPU unknown (CUDA_VISIBLE_DEVICES=GPU-8e1d7c6a)"))
      << d;
}

}  // namespace
}  // namespace moed::launch
