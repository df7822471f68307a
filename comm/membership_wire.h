// MembershipMessage (comm/membership.h) as bytes, for the ranks' endpoints:
// a version byte, then every field little-endian at a fixed place, then the
// member list. decode() refuses anything a rank of a world of `ranks` could
// not have sent (an unknown version or kind, a rank out of range, members
// not ascending, bytes short or left over), naming what was wrong: a bad
// message is an Input error, never a wrong decision.
#pragma once

#include <string>
#include <string_view>

#include "comm/membership.h"

namespace moed::comm {

std::string encode(const MembershipMessage& message);
MembershipMessage decode_membership_message(std::string_view bytes, int ranks);

}  // namespace moed::comm
