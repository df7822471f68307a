// The control plane's messages between ranks, as text: rank 0 broadcasts a
// boundary's actions, and every rank answers a migration stage with its
// report. Pure encoding and decoding (JSON inside), tested by round trips; a
// malformed message is an internal error that names what was wrong.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "runtime/control/migration_coordinator.h"

namespace moed::runtime {

struct BoundaryActions {
  std::vector<ControlAction> actions;
  bool stop = false;
  std::vector<std::uint64_t> follow;  // request ids to trace from now on (moectl trace --follow)
  bool operator==(const BoundaryActions&) const = default;
};

// Nothing to do (the usual boundary) encodes as empty text: one small broadcast.
std::string encode_actions(const BoundaryActions& boundary);
BoundaryActions decode_actions(const std::string& text);

std::string encode_report(const StageReport& report);
StageReport decode_report(const std::string& text);

}  // namespace moed::runtime
