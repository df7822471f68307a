// The hwloc reader on the test topologies of tests/data/topology/ (see
// tests/data/README.md): GPUs, NUMA nodes and NVLink matrices as hwloc reads
// them, the NUMA nodes' cores, Input errors for XML files hwloc refuses, and
// HWLOC_XMLFILE.
#include "launch/hwloc_topology.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "common/error.h"
#include "launch/nvlink_islands.h"
#include "tests/unit/launch/topology_test_support.h"
#include "tests/unit/test_support.h"

namespace moed::launch {
namespace {

using test_topology::contains;
using test_topology::Islands;
using test_topology::load;
using test_topology::topology_file;

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
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

// --- reading the test XMLs ----------------------------------------------------------

TEST(HwlocTopology, FindsTheGpusAndNumaNodesOfEachPairsHost) {
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

TEST(HwlocTopology, MapsTheNvlinkMatrixOntoTheGpus) {
  const HostTopology t = load("2x4-nvlink-pairs-host1.xml");
  ASSERT_EQ(t.nvlink_bandwidth.size(), 4u);
  for (int i = 0; i < 4; ++i)
    for (int j = 0; j < 4; ++j)
      EXPECT_EQ(t.nvlink_bandwidth[i][j], i != j && i / 2 == j / 2 ? 300000.0 : 0.0) << i << "," << j;
}

TEST(HwlocTopology, NvswitchHostIsOneIsland) {
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

TEST(HwlocTopology, HostWithoutNvlinkInformationIsOneIsland) {
  const HostTopology t = load("no-nvlink-4gpu.xml");
  EXPECT_EQ(t.host, "pcie1");
  ASSERT_EQ(t.gpus.size(), 4u);
  EXPECT_TRUE(t.nvlink_bandwidth.empty());
  EXPECT_EQ(nvlink_islands(t), (Islands{{0, 1, 2, 3}}));
}

// GPUs as NVML OS devices without PCI devices (a host whose PCI devices were
// filtered out), with a distances2 element written here: its `length`
// attributes are the byte lengths of their contents.
TEST(HwlocTopology, ReadsGpuOsDevicesWithoutPciDevices) {
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

// --- NUMA nodes ---------------------------------------------------------------------

TEST(HwlocTopology, NumaNodesWithCoresAndTheirCores) {
  const HwlocTopology topology = HwlocTopology::from_xml_file(topology_file("2x4-nvlink-pairs-host1.xml"));
  EXPECT_EQ(topology.numa_nodes_with_cores(), (std::vector<int>{0, 1}));
  EXPECT_EQ(topology.numa_node_cores(0), "0-7");
  EXPECT_EQ(topology.numa_node_cores(1), "8-15");
  EXPECT_EQ(topology.numa_node_cores(7), "?") << "no such node";
  EXPECT_EQ(topology.process_bound_within(7), std::nullopt);
  EXPECT_FALSE(topology.bind_process_to(7).empty());
}

// --- errors and sources -------------------------------------------------------------

TEST(HwlocTopology, MalformedXmlIsAnInputErrorNamingTheFile) {
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

TEST(HwlocTopology, ThisMachineHonoursHwlocXmlFile) {
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
