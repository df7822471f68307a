// What a rank says it runs at start-up: a defined hash of the printed
// configuration, so that ranks built by different compilers agree.
#include "runtime/daemon/start_up.h"

#include <gtest/gtest.h>

#include <sstream>

#include "runtime/config/config.h"

namespace moed::runtime {
namespace {

std::string printed(const Config& c) {
  std::ostringstream out;
  print_config(out, c);
  return out.str();
}

TEST(CommandSummary, IsTheFnv1aHashOfThePrintedConfig) {
  EXPECT_EQ(command_summary("serve", ""), "serve with configuration cbf29ce484222325");
  EXPECT_EQ(command_summary("serve", "a"), "serve with configuration af63dc4c8601ec8c");
  EXPECT_EQ(command_summary("--print-topology", "foobar"), "--print-topology with configuration 85944171f73967e8");
}

TEST(CommandSummary, FollowsEveryKeyOfTheConfig) {
  Config c = default_config();
  const std::string same = command_summary("serve", printed(c));
  EXPECT_EQ(command_summary("serve", printed(default_config())), same);
  c.workload.steps += 1;
  EXPECT_NE(command_summary("serve", printed(c)), same);
  EXPECT_NE(command_summary("--print-topology", printed(default_config())), same);
}

}  // namespace
}  // namespace moed::runtime
