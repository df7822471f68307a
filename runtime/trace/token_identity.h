// The one place that says which request a served row belongs to, for
// tracing: the request identity the router policies use too (TokenTag). The
// front door's rows carry their request id and position; a built-in
// workload's token gets them from request_of_token (runtime/workload/
// token_order.h: with [workload].positions_per_request = 1, a token is its
// own request at position 0).
#pragma once

#include <cstdint>

#include "runtime/router/router.h"

namespace moed::runtime::trace {

struct TokenIdentity {
  std::uint64_t request_id = 0;
  std::uint32_t position = 0;
};

inline TokenIdentity identity_of(const TokenTag& tag) { return {tag.request, tag.position}; }

}  // namespace moed::runtime::trace
