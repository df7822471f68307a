// Topology discovery from the test topologies of tests/data/topology/ (see
// tests/data/README.md): GPUs, NUMA nodes and NVLink matrices as hwloc reads
// them; NVLink islands of a host and of a job; descriptions; binding choices;
// and Input errors for XML files hwloc refuses.
#include <gtest/gtest.h>
#include <sched.h>

#include <cstdlib>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "common/error.h"
#include "launch/topology_discovery.h"
#include "tests/unit/test_support.h"

namespace moed::launch {
namespace {

using Islands = std::vector<std::vector<int>>;

std::string topology_file(const std::string& name) {
  return std::string(MOED_TEST_DATA_DIR) + "/topology/" + name;
}

HostTopology load(const std::string& name) {
  return read_host_topology(HwlocTopology::from_xml_file(topology_file(name)));
}

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

// Ranks of one host, local ranks 0..n-1, in rank order.
void add_host(std::vector<RankTopology>& ranks, const std::string& host, const HostTopology& t, int n) {
  for (int l = 0; l < n; ++l) ranks.push_back({host, l, t});
}

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

// --- reading the test XMLs ----------------------------------------------------------

TEST(TopologyDiscovery, FindsTheGpusAndNumaNodesOfEachPairsHost) {
  for (const char* name : {"2x4-nvlink-pairs-host1.xml", "2x4-nvlink-pairs-host2.xml"}) {
    SCOPED_TRACE(name);
    const HostTopology t = load(name);
    EXPECT_EQ(t.numa_nodes, 2);
    // host1 has NVML and CUDA OS devices per GPU, host2 NVML only plus a BMC's
    // VGA ("card0", not NVIDIA): 4 GPUs either way, named by NVML.
    ASSERT_EQ(t.gpus.size(), 4u);
    const std::vector<std::string> pci{"0000:1a:00.0", "0000:3c:00.0", "0000:9c:00.0", "0000:bd:00.0"};
    for (int g = 0; g < 4; ++g) {
      EXPECT_EQ(t.gpus[g].name, "nvml" + std::to_string(g));
      EXPECT_EQ(t.gpus[g].model, "NVIDIA H100 NVL");
      EXPECT_EQ(t.gpus[g].pci_bus_id, pci[g]);
      EXPECT_EQ(t.gpus[g].numa_node, g / 2) << "GPUs 0-1 on NUMA node 0, 2-3 on node 1";
    }
  }
  EXPECT_EQ(load("2x4-nvlink-pairs-host1.xml").host, "host1");
  EXPECT_EQ(load("2x4-nvlink-pairs-host2.xml").host, "host2");
}

TEST(TopologyDiscovery, MapsTheNvlinkMatrixOntoTheGpus) {
  const HostTopology t = load("2x4-nvlink-pairs-host1.xml");
  ASSERT_EQ(t.nvlink_bandwidth.size(), 4u);
  for (int i = 0; i < 4; ++i)
    for (int j = 0; j < 4; ++j)
      EXPECT_EQ(t.nvlink_bandwidth[i][j], i != j && i / 2 == j / 2 ? 300000.0 : 0.0) << i << "," << j;
}

TEST(TopologyDiscovery, NvlinkPairsGiveTwoIslandsOfTwoGpusPerHost) {
  EXPECT_EQ(nvlink_islands(load("2x4-nvlink-pairs-host1.xml")), (Islands{{0, 1}, {2, 3}}));
  EXPECT_EQ(nvlink_islands(load("2x4-nvlink-pairs-host2.xml")), (Islands{{0, 1}, {2, 3}}));
}

TEST(TopologyDiscovery, NvswitchHostIsOneIsland) {
  const HostTopology t = load("nvswitch-8gpu.xml");
  EXPECT_EQ(t.host, "dgx1");
  EXPECT_EQ(t.numa_nodes, 2);
  ASSERT_EQ(t.gpus.size(), 8u);
  for (int g = 0; g < 8; ++g) EXPECT_EQ(t.gpus[g].numa_node, g / 4);
  // No GPU-GPU link in hwloc's matrix: each GPU reaches each other through the
  // four switches (5, 4, 4 and 5 links of 25 GB/s).
  ASSERT_EQ(t.nvlink_bandwidth.size(), 8u);
  for (int i = 0; i < 8; ++i)
    for (int j = 0; j < 8; ++j) EXPECT_EQ(t.nvlink_bandwidth[i][j], i == j ? 0.0 : 450000.0);
  EXPECT_EQ(nvlink_islands(t), (Islands{{0, 1, 2, 3, 4, 5, 6, 7}}));
}

TEST(TopologyDiscovery, HostWithoutNvlinkInformationIsOneIsland) {
  const HostTopology t = load("no-nvlink-4gpu.xml");
  EXPECT_EQ(t.host, "pcie1");
  ASSERT_EQ(t.gpus.size(), 4u);
  EXPECT_TRUE(t.nvlink_bandwidth.empty());
  EXPECT_EQ(nvlink_islands(t), (Islands{{0, 1, 2, 3}}));
}

// GPUs as NVML OS devices without PCI devices (a host whose PCI devices were
// filtered out), with a distances2 element written here: its `length`
// attributes are the byte lengths of their contents.
TEST(TopologyDiscovery, ReadsGpuOsDevicesWithoutPciDevices) {
  auto osdev = [](int gp, int i) {
    return "    <object type=\"OSDev\" gp_index=\"" + std::to_string(gp) + "\" name=\"nvml" +
           std::to_string(i) + "\" subtype=\"NVML\" osdev_type=\"1\"/>\n";
  };
  auto element = [](const std::string& tag, const std::string& content) {
    return "    <" + tag + " length=\"" + std::to_string(content.size()) + "\">" + content + "</" + tag +
           ">\n";
  };
  const std::string xml =
      "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<!DOCTYPE topology SYSTEM \"hwloc2.dtd\">\n"
      "<topology version=\"2.0\">\n"
      "  <object type=\"Machine\" os_index=\"0\" cpuset=\"0x00000003\" complete_cpuset=\"0x00000003\" "
      "allowed_cpuset=\"0x00000003\" nodeset=\"0x00000001\" complete_nodeset=\"0x00000001\" "
      "allowed_nodeset=\"0x00000001\" gp_index=\"1\">\n"
      "    <object type=\"NUMANode\" os_index=\"0\" cpuset=\"0x00000003\" complete_cpuset=\"0x00000003\" "
      "nodeset=\"0x00000001\" complete_nodeset=\"0x00000001\" gp_index=\"2\"/>\n"
      "    <object type=\"PU\" os_index=\"0\" cpuset=\"0x00000001\" complete_cpuset=\"0x00000001\" "
      "nodeset=\"0x00000001\" complete_nodeset=\"0x00000001\" gp_index=\"3\"/>\n"
      "    <object type=\"PU\" os_index=\"1\" cpuset=\"0x00000002\" complete_cpuset=\"0x00000002\" "
      "nodeset=\"0x00000001\" complete_nodeset=\"0x00000001\" gp_index=\"4\"/>\n" +
      osdev(10, 0) + osdev(11, 1) + osdev(12, 2) +
      "  </object>\n"
      "  <distances2 type=\"OSDev\" nbobjs=\"3\" kind=\"9\" name=\"NVLinkBandwidth\" indexing=\"gp\">\n" +
      element("indexes", "10 11 12 ") + element("u64values", "1000000 0 50000 0 1000000 0 50000 0 1000000 ") +
      "  </distances2>\n</topology>\n";
  const HostTopology t = read_host_topology(HwlocTopology::from_xml_string(xml, "test string"));
  ASSERT_EQ(t.gpus.size(), 3u);
  EXPECT_EQ(t.gpus[2].name, "nvml2");
  EXPECT_EQ(t.gpus[2].pci_bus_id, "");
  EXPECT_EQ(t.gpus[2].numa_node, 0) << "the machine has one NUMA node";
  EXPECT_EQ(nvlink_islands(t), (Islands{{0, 2}, {1}}));
}

// --- islands from plain data --------------------------------------------------------

TEST(TopologyDiscovery, IslandsAreConnectedComponentsOfTheLinks) {
  EXPECT_EQ(nvlink_islands(linked_gpus(4, {{0, 1}, {1, 2}})), (Islands{{0, 1, 2}, {3}}));
  EXPECT_EQ(nvlink_islands(linked_gpus(4, {{3, 0}, {2, 1}})), (Islands{{0, 3}, {1, 2}}));
  EXPECT_EQ(nvlink_islands(linked_gpus(3, {})), (Islands{{0}, {1}, {2}})) << "a known matrix without links";
  HostTopology one_way = linked_gpus(2, {});
  one_way.nvlink_bandwidth[1][0] = 25000;
  EXPECT_EQ(nvlink_islands(one_way), (Islands{{0, 1}})) << "a link in one direction joins both GPUs";
  HostTopology no_gpu;
  no_gpu.numa_nodes = 1;
  EXPECT_TRUE(nvlink_islands(no_gpu).empty());
}

TEST(TopologyDiscovery, TwoHostJobOfNvlinkPairsGivesFourIslands) {
  std::vector<RankTopology> ranks;
  add_host(ranks, "host1", load("2x4-nvlink-pairs-host1.xml"), 4);
  add_host(ranks, "host2", load("2x4-nvlink-pairs-host2.xml"), 4);
  const RankIslands islands = rank_islands(ranks);
  EXPECT_EQ(islands.island_of_rank, (std::vector<int>{0, 0, 1, 1, 2, 2, 3, 3}));
  EXPECT_EQ(islands.source, "hwloc");
}

// The multi-rank tests run both "hosts" on one machine, each rank with its
// host's XML (HWLOC_XMLFILE): one launcher host name, local ranks 0-7.
TEST(TopologyDiscovery, TopologyHostNamesSeparateHostsEmulatedOnOneMachine) {
  std::vector<RankTopology> ranks;
  const HostTopology h1 = load("2x4-nvlink-pairs-host1.xml"), h2 = load("2x4-nvlink-pairs-host2.xml");
  for (int l = 0; l < 8; ++l) ranks.push_back({"vm", l, l < 4 ? h1 : h2});
  EXPECT_EQ(rank_islands(ranks).island_of_rank, (std::vector<int>{0, 0, 1, 1, 2, 2, 3, 3}));
}

TEST(TopologyDiscovery, NvswitchJobIsOneIslandPerHost) {
  std::vector<RankTopology> ranks;
  add_host(ranks, "a", load("nvswitch-8gpu.xml"), 8);
  add_host(ranks, "b", load("nvswitch-8gpu.xml"), 8);
  const RankIslands islands = rank_islands(ranks);
  EXPECT_EQ(islands.island_of_rank, (std::vector<int>{0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1}))
      << "one XML on two launcher hosts: still two hosts";
  EXPECT_EQ(islands.source, "hwloc");
}

TEST(TopologyDiscovery, HostsWithoutNvlinkOrGpusGiveOneIslandPerHost) {
  std::vector<RankTopology> ranks;
  add_host(ranks, "p1", load("no-nvlink-4gpu.xml"), 4);
  HostTopology cpu_only;
  cpu_only.host = "cpu1";
  cpu_only.numa_nodes = 1;
  add_host(ranks, "cpu1", cpu_only, 2);
  add_host(ranks, "p2", load("no-nvlink-4gpu.xml"), 4);
  const RankIslands islands = rank_islands(ranks);
  EXPECT_EQ(islands.island_of_rank, (std::vector<int>{0, 0, 0, 0, 1, 1, 2, 2, 2, 2}));
  EXPECT_EQ(islands.source, "hostname");
}

TEST(TopologyDiscovery, MixedJobNumbersIslandsInRankOrder) {
  std::vector<RankTopology> ranks;
  add_host(ranks, "p1", load("no-nvlink-4gpu.xml"), 2);
  add_host(ranks, "host1", load("2x4-nvlink-pairs-host1.xml"), 4);
  const RankIslands islands = rank_islands(ranks);
  EXPECT_EQ(islands.island_of_rank, (std::vector<int>{0, 0, 1, 1, 2, 2}));
  EXPECT_EQ(islands.source, "hwloc");
}

TEST(TopologyDiscovery, RanksUseTheGpuThatCudaVisibleDevicesNames) {
  const HostTopology t = load("2x4-nvlink-pairs-host1.xml");
  EXPECT_EQ(gpu_of_rank(t, 1, std::nullopt), 1);
  EXPECT_EQ(gpu_of_rank(t, 5, std::nullopt), 1);
  EXPECT_EQ(gpu_of_rank(t, 0, "2,3"), 2);
  EXPECT_EQ(gpu_of_rank(t, 3, "2,3"), 3);
  EXPECT_EQ(gpu_of_rank(t, 0, "7"), -1) << "no GPU 7 on this host";
  EXPECT_EQ(gpu_of_rank(t, 0, "GPU-8e1d7c6a"), -1) << "a UUID cannot be matched";
  EXPECT_EQ(gpu_of_rank(t, 0, ""), -1) << "every GPU hidden";
  EXPECT_EQ(gpu_of_rank(HostTopology{}, 0, std::nullopt), -1);

  // Two ranks given GPUs 2 and 3 by Slurm share the island {2,3}; a rank
  // whose GPU is unknown forms the host's island.
  std::vector<RankTopology> ranks{
      {"host1", 0, t, "2"}, {"host1", 1, t, "3"}, {"host1", 2, t, "GPU-8e1d7c6a"}};
  EXPECT_EQ(rank_islands(ranks).island_of_rank, (std::vector<int>{0, 0, 1}));
  const std::string d = describe_job(ranks, rank_islands(ranks));
  EXPECT_TRUE(contains(d,
                       "rank 1: host1, local rank 1, GPU 3 (nvml3, NVIDIA H100 NVL, PCI 0000:bd:00.0, NUMA "
                       "node 1) (CUDA_VISIBLE_DEVICES=3), island 0\n"))
      << d;
  EXPECT_TRUE(contains(d, "rank 2: host1, local rank 2, GPU unknown (CUDA_VISIBLE_DEVICES=GPU-8e1d7c6a)"))
      << d;
}

TEST(TopologyDiscovery, MoreRanksThanGpusShareTheGpusIslands) {
  std::vector<RankTopology> ranks;
  add_host(ranks, "host1", load("2x4-nvlink-pairs-host1.xml"), 8);  // local rank 5 -> GPU 1
  EXPECT_EQ(rank_islands(ranks).island_of_rank, (std::vector<int>{0, 0, 1, 1, 0, 0, 1, 1}));
}

// --- descriptions ---------------------------------------------------------------------

TEST(TopologyDiscovery, DescribeNamesGpusNumaNodesAndIslands) {
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
  HostTopology cpu_only;
  cpu_only.host = "cpu1";
  cpu_only.numa_nodes = 1;
  EXPECT_EQ(describe(cpu_only), "cpu1: 1 NUMA node, no GPU\n");
}

TEST(TopologyDiscovery, DescribeJobListsIslandsRanksAndHosts) {
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

// --- the all-gather form ------------------------------------------------------------------

TEST(TopologyDiscovery, EncodedRankTopologyDecodesToTheSame) {
  for (const char* name : {"2x4-nvlink-pairs-host1.xml", "nvswitch-8gpu.xml", "no-nvlink-4gpu.xml"}) {
    SCOPED_TRACE(name);
    const RankTopology rank{"node\"7", 3, load(name), "1,0"};  // a quote survives the encoding
    const RankTopology back = decode_rank_topology(encode_rank_topology(rank));
    EXPECT_EQ(back.host, rank.host);
    EXPECT_EQ(back.local_rank, 3);
    EXPECT_EQ(back.cuda_visible_devices, "1,0");
    const HostTopology &t = rank.topology, &b = back.topology;
    EXPECT_EQ(b.host, t.host);
    EXPECT_EQ(b.numa_nodes, t.numa_nodes);
    ASSERT_EQ(b.gpus.size(), t.gpus.size());
    for (std::size_t g = 0; g < t.gpus.size(); ++g) {
      EXPECT_EQ(b.gpus[g].name, t.gpus[g].name);
      EXPECT_EQ(b.gpus[g].model, t.gpus[g].model);
      EXPECT_EQ(b.gpus[g].pci_bus_id, t.gpus[g].pci_bus_id);
      EXPECT_EQ(b.gpus[g].numa_node, t.gpus[g].numa_node);
    }
    EXPECT_EQ(b.nvlink_bandwidth, t.nvlink_bandwidth);
  }
  EXPECT_EQ(decode_rank_topology(encode_rank_topology({"h", 0, {}})).cuda_visible_devices, std::nullopt);
  test::expect_error([] { decode_rank_topology("{\"host\": 3}"); }, ErrorKind::Internal, {"rank topology"});
}

// --- errors ---------------------------------------------------------------------------

TEST(TopologyDiscovery, MalformedXmlIsAnInputErrorNamingTheFile) {
  test::TempDir dir("moed_topology");
  const std::string whole = read_text(topology_file("2x4-nvlink-pairs-host1.xml"));
  const std::string cut = dir.write("cut.xml", whole.substr(0, whole.size() / 3));
  test::expect_error([&] { HwlocTopology::from_xml_file(cut); }, ErrorKind::Input,
                     {"topology XML " + cut + ": hwloc cannot parse it", "HWLOC_XML_VERBOSE"});

  // A distances2 element whose length attribute is not its content's length.
  std::string bad = whole;
  const auto at = bad.find("<indexes length=\"");
  ASSERT_NE(at, std::string::npos);
  bad.insert(at + std::string("<indexes length=\"").size(), "9");
  const std::string bad_length = dir.write("bad-length.xml", bad);
  test::expect_error([&] { HwlocTopology::from_xml_file(bad_length); }, ErrorKind::Input,
                     {"topology XML " + bad_length + ": hwloc cannot"});

  const std::string missing = dir.file("missing.xml");
  test::expect_error([&] { HwlocTopology::from_xml_file(missing); }, ErrorKind::Input,
                     {missing, "cannot read"});
  test::expect_error([] { HwlocTopology::from_xml_string("<topology", "rank 3's XML"); }, ErrorKind::Input,
                     {"rank 3's XML"});
}

// --- binding ---------------------------------------------------------------------------------

TEST(TopologyDiscovery, ChoosesTheNumaNodeOfTheRanksGpu) {
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

TEST(TopologyDiscovery, DoesNotBindThroughAnXmlTopology) {
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

TEST(TopologyDiscovery, BindsThisProcessOrSaysWhyNot) {
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

// An environment variable set for one test, restored after it.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const std::string& value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    ::setenv(name, value.c_str(), 1);
  }
  ~ScopedEnv() {
    if (old_)
      ::setenv(name_, old_->c_str(), 1);
    else
      ::unsetenv(name_);
  }

 private:
  const char* name_;
  std::optional<std::string> old_;
};

TEST(TopologyDiscovery, ThisMachineHonoursHwlocXmlFile) {
  {
    ScopedEnv env("HWLOC_XMLFILE", topology_file("2x4-nvlink-pairs-host2.xml"));
    const HwlocTopology topology = HwlocTopology::this_machine();
    EXPECT_FALSE(topology.is_this_system());
    EXPECT_EQ(read_host_topology(topology).host, "host2");
    EXPECT_TRUE(contains(topology.origin(), "2x4-nvlink-pairs-host2.xml")) << topology.origin();
  }
  {
    ScopedEnv env("HWLOC_XMLFILE", "/nonexistent/topology.xml");
    test::expect_error([] { HwlocTopology::this_machine(); }, ErrorKind::Input,
                       {"/nonexistent/topology.xml"});
  }
}

}  // namespace
}  // namespace moed::launch
