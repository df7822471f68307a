#include "common/available_memory.h"

#include <gtest/gtest.h>

namespace moed {
namespace {

TEST(AvailableMemory, ParsesMemAvailable) {
  const char* meminfo =
      "MemTotal:       24000000 kB\nMemFree:         1000 kB\nMemAvailable:   22000000 kB\nBuffers: 5 kB\n";
  EXPECT_EQ(parse_mem_available(meminfo), std::uint64_t(22000000) << 10);
  EXPECT_EQ(parse_mem_available("MemTotal: 5 kB\n"), std::nullopt);
  EXPECT_EQ(parse_mem_available("MemAvailable: lots kB\n"), std::nullopt);
  EXPECT_EQ(parse_mem_available(""), std::nullopt);
}

TEST(AvailableMemory, ParsesCgroupLimits) {
  EXPECT_EQ(parse_cgroup_limit("8589934592\n"), 8589934592u);
  EXPECT_EQ(parse_cgroup_limit("max\n"), std::nullopt);
  EXPECT_EQ(parse_cgroup_limit("9223372036854771712\n"), std::nullopt);  // cgroup v1: no limit
  EXPECT_EQ(parse_cgroup_limit(""), std::nullopt);
  EXPECT_EQ(parse_cgroup_v2_path("12:cpu:/x\n0::/user.slice/job-7\n"), "/user.slice/job-7");
  EXPECT_EQ(parse_cgroup_v2_path("12:memory:/x\n"), std::nullopt);
}

TEST(AvailableMemory, ThisHostHasSome) {
  const auto m = available_memory();
  ASSERT_TRUE(m.has_value()) << "neither /proc/meminfo nor a cgroup limit could be read";
  EXPECT_GT(m->bytes, 0u);
  EXPECT_FALSE(m->source.empty());
}

TEST(AvailableMemory, HumanBytes) {
  EXPECT_EQ(human_bytes(999), "999 B");
  EXPECT_EQ(human_bytes(24'400'000'000), "24.4 GB");
  EXPECT_EQ(human_bytes(1'741'673'981'820'928), "1.7 PB");
}

}  // namespace
}  // namespace moed
