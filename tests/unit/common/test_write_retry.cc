#include "common/write_retry.h"

#include <gtest/gtest.h>

namespace moed {

TEST(WriteRetry, AHealthyFileIsAlwaysDue) {
  WriteRetry w("the statistics file s.bin");
  EXPECT_TRUE(w.due(0));
  EXPECT_FALSE(w.failing());
  EXPECT_EQ(w.succeeded(), "");
  EXPECT_EQ(w.alert(5), "");
}

TEST(WriteRetry, FailuresBackOffDoublingToTheCap) {
  WriteRetry w("the statistics file s.bin");
  double t = 100;
  double expected = WriteRetry::kFirstBackoffS;
  for (int i = 0; i < 12; ++i) {
    const std::string line = w.failed(t, "No space left on device");
    EXPECT_NE(line.find("No space left on device"), std::string::npos) << line;
    EXPECT_NE(line.find("the last good file is kept"), std::string::npos);
    EXPECT_FALSE(w.due(t + expected - 0.01)) << i;
    EXPECT_TRUE(w.due(t + expected)) << i;
    t += expected;
    expected = std::min(WriteRetry::kMaxBackoffS, 2 * expected);
  }
  EXPECT_EQ(w.failures(), 12u);
  EXPECT_NE(w.alert(t).find("cannot write the statistics file s.bin"), std::string::npos);
}

TEST(WriteRetry, ASuccessEndsTheRunAndResetsTheBackoff) {
  WriteRetry w("x");
  w.failed(0, "read-only file system");
  w.failed(1, "read-only file system");
  EXPECT_EQ(w.succeeded(), "x written again after 2 failed tries");
  EXPECT_FALSE(w.failing());
  EXPECT_TRUE(w.due(1));
  EXPECT_EQ(w.failures(), 2u);  // since start, for the metrics
  w.failed(10, "again");
  EXPECT_TRUE(w.due(10 + WriteRetry::kFirstBackoffS));
}

}  // namespace moed
