// The admin socket's answers to the snapshot commands (status, metrics,
// placement, migration, stats) from what the rank last published
// (runtime/observe/snapshot.h). Any thread; they never wait on the step
// thread's long work: a stats dump writes its file outside the snapshot's
// mutex, from the statistics it shares.
#pragma once

#include <nlohmann/json.hpp>

#include "runtime/admin/protocol.h"
#include "runtime/observe/snapshot.h"

namespace moed::runtime {

// The answer's body, or an error body (admin::error_body): refused before
// there is anything to show, internal for a command that has no snapshot.
nlohmann::json snapshot_answer(const Snapshot& snapshot, const admin::Request& request);

}  // namespace moed::runtime
