#include <gtest/gtest.h>

#include "comm/comm_config.h"
#include "comm/transport.h"

namespace moed::comm {

// comm_config.h names the backends without linking them (so that moe-place
// reads configs without MPI or UCX); the names must stay those of the table.
TEST(CommConfig, BackendChoicesAreAutoThenTheTransportTable) {
  std::vector<std::string> expected{"auto"};
  for (const auto& name : transport_backend_names()) expected.push_back(name);
  EXPECT_EQ(kBackendNames.names(), expected);
}

}  // namespace moed::comm
