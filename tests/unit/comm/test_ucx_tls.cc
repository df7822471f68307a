// UCX_TLS for elastic serving (comm/ucx/ucx_handles.h): cma, which reads
// and writes a peer's memory directly, is left out of whatever the operator
// chose, the shared-memory aliases become the transports they stand for
// less cma, and nothing else changes.
#include <gtest/gtest.h>

#include <string>

#include "comm/ucx/ucx_handles.h"

namespace moed::comm::ucx {
namespace {

TEST(UcxTls, TheTransportsThatReadAPeersMemoryAreLeftOut) {
  EXPECT_EQ(tls_without_peer_memory_access(""), "^cma");
  EXPECT_EQ(tls_without_peer_memory_access("all"), "^cma");
  EXPECT_EQ(tls_without_peer_memory_access("^ib"), "^ib,cma");
  EXPECT_EQ(tls_without_peer_memory_access("^cma,ud"), "^ud,cma");
  EXPECT_EQ(tls_without_peer_memory_access("tcp,self"), "tcp,self");
  EXPECT_EQ(tls_without_peer_memory_access("sm,tcp,self"), "posix,sysv,tcp,self");
  EXPECT_EQ(tls_without_peer_memory_access("shm,cma,rc"), "posix,sysv,rc");
  EXPECT_EQ(tls_without_peer_memory_access("cma"), "");
}

}  // namespace
}  // namespace moed::comm::ucx
