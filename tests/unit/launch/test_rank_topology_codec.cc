// A rank's topology through the start-up all-gather's string form and back.
#include "launch/rank_topology_codec.h"

#include <gtest/gtest.h>

#include <optional>
#include <string>

#include "common/error.h"
#include "tests/unit/launch/topology_test_support.h"
#include "tests/unit/test_support.h"

namespace moed::launch {
namespace {

using test_topology::load;

TEST(RankTopologyCodec, EncodedRankTopologyDecodesToTheSame) {
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

}  // namespace
}  // namespace moed::launch
