// The one place that says which request a served row belongs to, for
// tracing: the front door's rows carry their request id and position; a
// built-in workload's token is its own request (id = the token's global id,
// position 0). Workloads that grow sequences change only this mapping.
#pragma once

#include <cstdint>

namespace moed::runtime::trace {

struct TokenIdentity {
  std::uint64_t request_id = 0;
  std::uint32_t position = 0;
};

inline TokenIdentity workload_token_identity(std::uint64_t token_id) { return {token_id, 0}; }
inline TokenIdentity front_door_identity(std::uint64_t request_id, std::uint32_t position) {
  return {request_id, position};
}

}  // namespace moed::runtime::trace
