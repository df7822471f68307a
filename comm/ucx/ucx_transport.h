// The UCX backend of Transport (ucp): one context and one worker per rank,
// an endpoint to every peer, worker addresses exchanged over the Bootstrap
// (MPI in the job, threads in a unit test: a worker per thread).
//
// - exchange: per peer one tagged receive posted straight into the receive
//   buffer, then the tagged sends; the tag is the exchange's sequence number
//   and the sender's rank, so a fast rank's next exchange cannot match this
//   one. The self block is a memcpy. The wait progresses the worker with the
//   [comm].timeout_ms deadline, and on expiry names the ranks whose data has
//   not arrived and the sends not completed.
// - windows: memory allocated and registered by ucp_mem_map; base addresses
//   and packed rkeys are all-gathered over the tagged exchange; put is
//   ucp_put_nbx, flush is ucp_worker_flush_nbx.
//
// Progress rule: UCX moves data only inside ucp_worker_progress, and over tcp
// a put into a rank's window does not complete until that rank progresses
// its worker (a rank blocked in an MPI call does not). So while windows are
// in use, every rank must keep calling Transport::progress() (or be inside
// an exchange, a flush or a window's creation or destruction, which progress
// the worker themselves) until its peers' flushes have returned. The engine's
// exchanges do this; a rank that waits on something else (an MPI collective,
// a long computation) must call progress() in its wait loop.
//
// Lifetime: the transport and its windows are destroyed collectively (all
// ranks, in the same order); the teardown synchronises over the bootstrap while
// progressing the worker, then closes the endpoints gracefully. After a
// failure (a deadline, a UCX error, an exception unwinding) the teardown is
// local and skips the peers, since the job is about to end.
#pragma once

#include <memory>
#include <optional>
#include <string>

#include "comm/transport.h"

namespace moed::comm {

// Collective over the bootstrap's ranks: every rank initialises UCX, and all
// agree before any connects, so a rank where UCX fails cannot leave the
// others hanging. The bootstrap must outlive the transport and its windows.
std::unique_ptr<Transport> create_ucx_transport(const CommConfig& config, Bootstrap& bootstrap);

// Why UCX cannot run in this process (ucp_init or a worker fails, e.g. no
// usable transport in UCX_TLS), or nullopt when it can; any bootstrap will do.
std::optional<std::string> ucx_unavailable(const CommConfig& config, const Bootstrap& bootstrap);

}  // namespace moed::comm
