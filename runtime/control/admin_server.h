// The admin socket of one daemon rank: a Unix stream socket <dir>/moed-<rank>.sock,
// mode 0600, served by its own thread with one poll() loop (a SocketService,
// common/socket_service.h: the listener, peer check, admission and wake-up).
//
// The server never blocks or slows the daemon: it owns its thread, every fd is
// non-blocking, each client has a bounded input line and a bounded output
// queue, and the daemon is reached only through two quick handlers:
//
//   snapshot_answer(request) -> json   status, metrics, placement, stats, migration:
//       called on the server thread; the daemon answers from a snapshot it
//       publishes under a mutex. Return the answer's fields (an object), or
//       error_body(code, message) for an error answer. A throw becomes `internal`.
//   submit(request, reply)             control commands (reoptimize, migrate,
//       drain, shutdown), on the coordinator only: called on the server thread;
//       the daemon queues the request and calls reply(answer_line) later from
//       any thread (its step loop), once, with a line made by answer_ok or
//       answer_error. A reply for a client that has gone is dropped; a reply
//       may outlive the server.
//
// Answers go out in the order of the requests on each connection, even when a
// control command's reply comes later than the answers to the requests after
// it. Control commands on a rank other than the coordinator get not_coordinator.
//
// Connections from a uid other than the daemon's (root excepted) get one
// `forbidden` line and are closed; connections past max_clients get one
// `too_many_clients` line. A line over max_line gets `line_too_long` and the
// connection is closed; a client whose unread answers exceed max_pending_bytes
// is dropped; a client idle for idle_timeout_ms (no bytes either way, no reply
// pending) is closed, and so is one that has not finished a line within
// line_timeout_ms of its first byte (`line_timeout`). When every slot is
// taken, a new client evicts the one whose unfinished line is oldest
// (`evicted`); only when no client holds one is it refused. So clients that
// trickle bytes cannot lock an operator out. A client that half-closes still
// gets its answers.
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "runtime/admin/protocol.h"

namespace moed::runtime::admin {

struct Limits {
  std::size_t max_line = kDefaultMaxLine;        // bytes per request line, newline excluded
  std::size_t max_pending_bytes = 1024 * 1024;   // answers queued for a client that does not read
  int max_clients = 64;
  int idle_timeout_ms = 60'000;
  // From a line's first byte to its newline: a client that dribbles bytes is
  // never idle, so idleness alone would let it hold a slot for ever.
  int line_timeout_ms = 10'000;
  int max_in_flight = 8;  // control requests awaiting their reply, per connection
};

using Reply = std::function<void(std::string answer_line)>;

struct Handlers {
  std::function<json(const Request&)> snapshot_answer;
  std::function<void(Request, Reply)> submit;
};

// What the server has seen since it started (for metrics and tests).
struct AdminCounters {
  std::uint64_t accepted = 0;          // connections served
  std::uint64_t refused_uid = 0;       // `forbidden`
  std::uint64_t refused_full = 0;      // `too_many_clients`
  std::uint64_t requests = 0;          // non-blank lines handled
  std::uint64_t lines_too_long = 0;
  std::uint64_t dropped_slow = 0;      // past max_pending_bytes
  std::uint64_t closed_idle = 0;
  std::uint64_t closed_slow_line = 0;  // a line not finished within line_timeout_ms
  std::uint64_t evicted = 0;           // partial lines dropped to admit a new client
  std::uint64_t turns = 0;             // poll loop turns: an idle server must not spin
  std::uint64_t clients = 0;           // connections held now
  std::uint64_t bytes_read = 0;        // request bytes read, counted once the lines they end are handled
};

class AdminServer {
 public:
  // Creates `dir` if missing (mode 0700), checks it (a directory, ours, not
  // writable by group or others), replaces a stale socket left by a dead
  // daemon, binds, sets mode 0600, listens, and starts the thread. Throws a
  // moed::Error naming the path when the dir or the socket path is unusable
  // (Usage) or another daemon listens there, or a system call fails (Runtime).
  AdminServer(const std::string& dir, int rank, int coordinator_rank, Handlers handlers,
              Limits limits = {});
  // Stops the thread, answers pending control requests with shutting_down
  // (best effort), closes every connection and removes the socket file (when
  // it is still the one this server bound).
  ~AdminServer();
  AdminServer(const AdminServer&) = delete;
  AdminServer& operator=(const AdminServer&) = delete;

  const std::string& path() const;
  AdminCounters counters() const;
  // Elastic serving: the coordinator is now world rank `rank` (the lowest
  // survivor of a loss); control commands go there from now on.
  void set_coordinator(int rank);

  // <dir>/moed-<rank>.sock
  static std::string socket_path(const std::string& dir, int rank);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace moed::runtime::admin
