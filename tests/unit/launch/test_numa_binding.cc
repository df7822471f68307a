// Binding a rank to its GPU's NUMA node: the choice of node on the test
// topologies, no binding through an XML topology, and this process's binding.
#include "launch/numa_binding.h"

#include <gtest/gtest.h>
#include <sched.h>

#include <cstdlib>
#include <string>

#include "tests/unit/launch/topology_test_support.h"

namespace moed::launch {
namespace {

using test_topology::contains;
using test_topology::topology_file;

TEST(NumaBinding, ChoosesTheNumaNodeOfTheRanksGpu) {
  const HwlocTopology topology = HwlocTopology::from_xml_file(topology_file("2x4-nvlink-pairs-host1.xml"));
  const HostTopology host = read_host_topology(topology);
  const int expected[] = {0, 0, 1, 1, 0, 0, 1, 1};
  for (int l = 0; l < 8; ++l) EXPECT_EQ(choose_numa_node(topology, host, l).numa_node, expected[l]) << l;
  EXPECT_EQ(choose_numa_node(topology, host, 2).why, "NUMA node of GPU 2 (0000:9c:00.0)");

  HostTopology without_gpus = host;
  without_gpus.gpus.clear();
  const NumaChoice c = choose_numa_node(topology, without_gpus, 3);
  EXPECT_EQ(c.numa_node, 1);
  EXPECT_EQ(c.why, "local rank 3 mod 2 NUMA nodes with cores");

  // Slurm's CUDA_VISIBLE_DEVICES: local rank 0 uses physical GPU 3.
  EXPECT_EQ(choose_numa_node(topology, host, 0, "3,2").numa_node, 1);
  EXPECT_EQ(choose_numa_node(topology, host, 1, "3,2").why, "NUMA node of GPU 2 (0000:9c:00.0)");
  EXPECT_EQ(
      choose_numa_node(topology, host, 1, "GPU-8e1d7c6a").why,
      "local rank 1 mod 2 NUMA nodes with cores; its GPU in CUDA_VISIBLE_DEVICES=GPU-8e1d7c6a is not in "
      "hwloc's list");

  HostTopology unknown_node = host;
  unknown_node.gpus[0].numa_node = -1;
  EXPECT_EQ(choose_numa_node(topology, unknown_node, 4).why,
            "local rank 4 mod 2 NUMA nodes with cores; GPU 0 (0000:1a:00.0)'s node unknown");
}

TEST(NumaBinding, DoesNotBindThroughAnXmlTopology) {
  const HwlocTopology topology = HwlocTopology::from_xml_file(topology_file("2x4-nvlink-pairs-host2.xml"));
  EXPECT_FALSE(topology.is_this_system());
  const BindResult r = bind_to_gpu_numa(topology, 2);
  EXPECT_FALSE(r.bound);
  EXPECT_EQ(r.numa_node, 1);
  EXPECT_TRUE(contains(r.description, "not this machine")) << r.description;
  EXPECT_TRUE(contains(r.description, "NUMA node 1 (cores 8-15; NUMA node of GPU 2")) << r.description;
}

// Restores the process's CPU affinity when the test ends.
class SavedAffinity {
 public:
  SavedAffinity() { saved_ = ::sched_getaffinity(0, sizeof set_, &set_) == 0; }
  ~SavedAffinity() {
    if (saved_) ::sched_setaffinity(0, sizeof set_, &set_);
  }

 private:
  cpu_set_t set_{};
  bool saved_ = false;
};

TEST(NumaBinding, BindsThisProcessOrSaysWhyNot) {
  if (std::getenv("HWLOC_XMLFILE")) GTEST_SKIP() << "HWLOC_XMLFILE is set";
  SavedAffinity restore;
  const BindResult r = bind_to_gpu_numa(0);  // never throws
  ASSERT_FALSE(r.description.empty());
  if (r.numa_node >= 0) {
    EXPECT_TRUE(r.bound || contains(r.description, "not bound to NUMA node")) << r.description;
    // A second call finds the process within the node and leaves it there.
    if (r.bound) {
      EXPECT_TRUE(contains(bind_to_gpu_numa(0).description, "already bound")) << r.description;
    }
  }
}

}  // namespace
}  // namespace moed::launch
