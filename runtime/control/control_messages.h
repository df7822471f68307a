// The control plane's messages between ranks, as text: rank 0 broadcasts a
// boundary's actions, and every rank answers a migration stage with its
// report. Pure encoding and decoding (JSON inside), tested by round trips; a
// malformed message is an internal error that names what was wrong.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "runtime/control/migration_coordinator.h"

namespace moed::runtime {

// A process that joined (`moed --join`, runtime/join/join_listener.h): every
// member reaches it at the boundary that carries it.
struct JoinerArrival {
  int world_rank = -1;
  std::string host;
  std::vector<std::byte> address;  // its UCX worker address
  bool operator==(const JoinerArrival&) const = default;
};

struct BoundaryActions {
  std::vector<ControlAction> actions;
  bool stop = false;
  std::vector<std::uint64_t> follow;  // request ids to trace from now on (moectl trace --follow)
  std::vector<JoinerArrival> arrivals;
  bool operator==(const BoundaryActions&) const = default;
};

// Nothing to do (the usual boundary) encodes as empty text: one small broadcast.
std::string encode_actions(const BoundaryActions& boundary);
BoundaryActions decode_actions(const std::string& text);

std::string encode_report(const StageReport& report);
StageReport decode_report(const std::string& text);

}  // namespace moed::runtime
