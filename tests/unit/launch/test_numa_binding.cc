// Binding a rank to its GPU's NUMA node: the choice of node on the test
// topologies, no binding through an XML topology, the binding itself through
// a two-node topology that hwloc takes for this machine, and this machine's.
#include "launch/numa_binding.h"

#include <gtest/gtest.h>
#include <sched.h>

#include <cstdio>
#include <cstdlib>
#include <regex>
#include <string>
#include <utility>
#include <vector>

#include "launch/launch_env.h"

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

// The CPUs this process may run on now, ascending.
std::vector<int> affinity() {
  cpu_set_t set{};
  if (::sched_getaffinity(0, sizeof set, &set) != 0) return {};
  std::vector<int> cpus;
  for (int c = 0; c < CPU_SETSIZE; ++c)
    if (CPU_ISSET(c, &set)) cpus.push_back(c);
  return cpus;
}

// An hwloc bitmap as hwloc's XML writes it: 32-bit words, the highest first
// ("0x00000001,0x00000000" is bit 32).
std::string bitmap(const std::vector<int>& bits) {
  std::vector<unsigned> words;
  for (int b : bits) {
    if (std::size_t(b / 32) >= words.size()) words.resize(std::size_t(b / 32) + 1, 0);
    words[std::size_t(b / 32)] |= 1u << (b % 32);
  }
  std::string text;
  for (std::size_t w = words.size(); w-- > 0;) {
    char word[16];
    std::snprintf(word, sizeof word, "0x%08x", words[w]);
    text += (text.empty() ? "" : ",") + std::string(word);
  }
  return text;
}

// hwloc's set attributes of an object over `cpus` in NUMA nodes `nodes`.
std::string sets(const std::vector<int>& cpus, const std::vector<int>& nodes) {
  return "cpuset=\"" + bitmap(cpus) + "\" complete_cpuset=\"" + bitmap(cpus) + "\" nodeset=\"" + bitmap(nodes) +
         "\" complete_nodeset=\"" + bitmap(nodes) + "\"";
}

// A host of two NUMA nodes, each one package of one core of one CPU: node 0
// holds CPU a, node 1 CPU b.
std::string two_node_xml(int a, int b) {
  std::string xml = "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<!DOCTYPE topology SYSTEM \"hwloc2.dtd\">\n"
                    "<topology version=\"2.0\">\n  <object type=\"Machine\" os_index=\"0\" " +
                    sets({a, b}, {0, 1}) + " allowed_cpuset=\"" + bitmap({a, b}) + "\" allowed_nodeset=\"" +
                    bitmap({0, 1}) + "\" gp_index=\"1\">\n";
  int gp = 2;
  for (const auto& [node, cpu] : {std::pair{0, a}, std::pair{1, b}}) {
    const auto object = [&, node = node, cpu = cpu](const char* type, int os_index, const char* end) {
      return std::string("<object type=\"") + type + "\" os_index=\"" + std::to_string(os_index) + "\" " +
             sets({cpu}, {node}) + " gp_index=\"" + std::to_string(gp++) + "\"" + end + "\n";
    };
    xml += "    " + object("Package", node, ">");
    xml += "      " + object("NUMANode", node, "/>");
    xml += "      " + object("Core", node, ">");
    xml += "        " + object("PU", cpu, "/>");
    xml += "      </object>\n    </object>\n";
  }
  return xml + "  </object>\n</topology>\n";
}

// Loaded with HWLOC_THISSYSTEM=1 (hwloc's own switch, read when a topology
// loads): hwloc then takes the XML for this machine, and its binding calls
// reach sched_setaffinity. No real test host can promise two NUMA nodes.
HwlocTopology as_this_system(const std::string& xml) {
  ::setenv("HWLOC_THISSYSTEM", "1", 1);
  struct Unset {
    ~Unset() { ::unsetenv("HWLOC_THISSYSTEM"); }
  } unset;
  return HwlocTopology::from_xml_string(xml, "two-node test host");
}

TEST(NumaBinding, BindsThisProcessToTheChosenNodesCores) {
  const std::vector<int> allowed = affinity();
  if (allowed.size() < 2) GTEST_SKIP() << "this process may run on one CPU only";
  SavedAffinity restore;
  const int a = allowed[0], b = allowed[1];
  const HwlocTopology topology = as_this_system(two_node_xml(a, b));
  ASSERT_TRUE(topology.is_this_system());
  ASSERT_EQ(topology.numa_nodes_with_cores(), (std::vector<int>{0, 1}));

  // Local rank 1 of a host without GPUs: the second node with cores.
  const std::string node1 = "NUMA node 1 (cores " + std::to_string(b) + "; local rank 1 mod 2 NUMA nodes with cores)";
  const BindResult r = bind_to_gpu_numa(topology, 1);
  EXPECT_TRUE(r.bound) << r.description;
  EXPECT_EQ(r.numa_node, 1);
  EXPECT_EQ(r.description, "bound to " + node1);
  EXPECT_EQ(affinity(), std::vector<int>{b}) << "the affinity is the node's cpuset";

  // Within the node already: left as it is.
  const BindResult again = bind_to_gpu_numa(topology, 1);
  EXPECT_TRUE(again.bound);
  EXPECT_EQ(again.description, "already bound to cores " + std::to_string(b) + " within " + node1);
  EXPECT_EQ(affinity(), std::vector<int>{b});

  // Local rank 2: node 0, which the process is not within: bound there.
  const BindResult other = bind_to_gpu_numa(topology, 2);
  EXPECT_TRUE(other.bound) << other.description;
  EXPECT_EQ(other.numa_node, 0);
  EXPECT_EQ(other.description,
            "bound to NUMA node 0 (cores " + std::to_string(a) + "; local rank 2 mod 2 NUMA nodes with cores)");
  EXPECT_EQ(affinity(), std::vector<int>{a});
}

// On this machine's own topology (one NUMA node, often, with the process
// already within it): bound means within the named node's cores, exactly
// them when the binding was made now; not bound leaves the affinity alone and
// says why.
TEST(NumaBinding, OnThisMachineBindsToTheNamedNodeOrSaysWhyNot) {
  if (std::getenv("HWLOC_XMLFILE")) GTEST_SKIP() << "HWLOC_XMLFILE is set";
  SavedAffinity restore;
  const std::vector<int> before = affinity();
  const BindResult r = bind_to_gpu_numa(0);  // never throws
  const std::string now = format_cpu_list(affinity());
  if (!r.bound) {
    EXPECT_EQ(affinity(), before);
    EXPECT_TRUE(std::regex_match(r.description, std::regex(R"(not bound( to NUMA node \d+ \(cores .*\))?: .+)")))
        << r.description;
    return;
  }
  ASSERT_GE(r.numa_node, 0) << r.description;
  const std::string cores = HwlocTopology::this_machine().numa_node_cores(r.numa_node);
  const std::string node = "NUMA node " + std::to_string(r.numa_node) + " (cores " + cores + "; ";
  if (contains(r.description, "already bound")) {
    EXPECT_EQ(affinity(), before);
    EXPECT_EQ(r.description.rfind("already bound to cores " + now + " within " + node, 0), 0u) << r.description;
  } else {
    EXPECT_EQ(r.description.rfind("bound to " + node, 0), 0u) << r.description;
    EXPECT_EQ(now, cores) << "the affinity after binding is the node's cpuset";
  }
}

}  // namespace
}  // namespace moed::launch
