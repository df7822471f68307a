// The pure pieces of the daemon's start-up (start_up.cc), apart from MPI so
// that they are unit-tested.
#pragma once

#include <string>
#include <string_view>

#include "placement/placement.h"

namespace moed::runtime {

// What a rank says it runs, for the first collective of every mode: "serve
// with configuration 0123456789abcdef", the FNV-1a hash (common/rng.h's
// hash_name) of the configuration as print_config writes it. A defined hash,
// so that ranks built by different compilers agree.
std::string command_summary(std::string_view mode, std::string_view printed_config);

// "epoch 0, 2 replicated experts, at most 4 slots per rank" (", 1 split expert" when some are)
std::string placement_details(const placement::Placement& p);

}  // namespace moed::runtime
