// The control channel's collectives over the data transport's exchanges
// (comm/control_channel.h), so that a run needs MPI only to start
// ([comm].control = "transport"). Each collective is one or two exchanges
// on every rank, opened in the same order as the data path's (the daemon's
// main thread makes both), each under the transport's deadline:
//  - broadcast: rank 0 sends its block to every other rank;
//  - gather: every rank sends its block to rank 0 (of sizes first when they
//    may differ);
//  - reductions: a gather, folded on rank 0 in rank order (so a sum of
//    doubles has the same bits on every run);
//  - all_max and all_gather_strings: every rank's block to every rank.
// Rank 0 receives R blocks where MPI would reduce along a tree: fine for
// the per-step figures and commands; a large reduction (routing statistics)
// costs rank 0 R times its size in memory and bytes received.
#pragma once

#include <memory>

#include "comm/control_channel.h"
#include "comm/transport.h"

namespace moed::comm {

// `transport` must outlive the link's calls.
std::unique_ptr<ControlLink> transport_control_link(Transport& transport);

}  // namespace moed::comm
