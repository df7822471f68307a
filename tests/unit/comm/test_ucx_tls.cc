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

// An exchange whose send or receive fails with one of these names its peer
// as unreachable (elastic serving suspects it) instead of ending the rank;
// any other failure is a broken exchange.
TEST(UcxStatus, OnlyAGoneConnectionMakesAPeerUnreachable) {
  for (ucs_status_t gone : {UCS_ERR_ENDPOINT_TIMEOUT, UCS_ERR_CONNECTION_RESET, UCS_ERR_UNREACHABLE,
                            UCS_ERR_NOT_CONNECTED, UCS_ERR_REJECTED})
    EXPECT_TRUE(connection_gone(gone)) << ucs_status_string(gone);
  for (ucs_status_t other : {UCS_OK, UCS_INPROGRESS, UCS_ERR_MESSAGE_TRUNCATED, UCS_ERR_CANCELED,
                             UCS_ERR_NO_MEMORY, UCS_ERR_INVALID_PARAM, UCS_ERR_IO_ERROR})
    EXPECT_FALSE(connection_gone(other)) << ucs_status_string(other);
}

}  // namespace
}  // namespace moed::comm::ucx
