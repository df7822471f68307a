// Reading this process's resident memory: the status lines, and that the
// figures follow an allocation the process touches.
#include "common/process_memory.h"

#include <gtest/gtest.h>

#include <cstring>
#include <vector>

namespace moed {
namespace {

TEST(ProcessMemory, ParsesKbLines) {
  const std::string status = "Name:\tmoed\nVmHWM:\t  123456 kB\nVmRSS:\t    1024 kB\nVmRSSX:\t1 kB\n";
  EXPECT_EQ(parse_kb_line(status, "VmHWM"), 123456ull << 10);
  EXPECT_EQ(parse_kb_line(status, "VmRSS"), 1024ull << 10);  // not VmRSSX
  EXPECT_EQ(parse_kb_line(status, "VmSwap"), std::nullopt);
  EXPECT_EQ(parse_kb_line("VmRSS:\t12 MB\n", "VmRSS"), std::nullopt);
  EXPECT_EQ(parse_kb_line("VmRSS:\tx kB\n", "VmRSS"), std::nullopt);
  EXPECT_EQ(parse_kb_line("VmRSS:\t99999999999999999999 kB", "VmRSS"), std::nullopt);
}

TEST(ProcessMemory, FollowsWhatTheProcessTouches) {
  const auto before = process_memory();
  ASSERT_TRUE(before);  // Linux
  EXPECT_GE(before->peak_bytes, before->rss_bytes);
  {
    std::vector<char> block(64 << 20);
    std::memset(block.data(), 1, block.size());
    const auto during = process_memory();
    EXPECT_GE(during->rss_bytes, before->rss_bytes + (60 << 20));
    EXPECT_GE(during->peak_bytes, during->rss_bytes);
  }
  const auto after = process_memory();
  EXPECT_GE(after->peak_bytes, before->rss_bytes + (60 << 20));  // the peak remembers it
  if (reset_peak_memory()) {
    const auto reset = process_memory();
    EXPECT_LT(reset->peak_bytes, after->peak_bytes);
  }
}

}  // namespace
}  // namespace moed
