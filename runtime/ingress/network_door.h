// The front door's network side ([ingress].listen): attention workers on
// other hosts connect to a rank over UCX (a ucp_listener; TCP here, RDMA
// where the fabric has it, as UCX chooses), prove they hold the cluster's
// key (client/auth.h), and then submit layers as clients on the host do.
// A submit's ids, positions and rows arrive as one active message, straight
// into the client's slot in this rank's memory; the done carries the
// outputs back from the same slot. Queueing, batching and the bits are the
// Unix door's (the Desk).
//
// One thread of its own drives the UCX worker: it accepts connections,
// runs handshakes, places arriving rows and sends what the step thread
// answers (posted to it and woken by ucp_worker_signal). Waiting, it sleeps
// on the worker's event fd: idle clients cost no CPU.
//
// Abuse is bounded and counted: handshakes in progress (in all, and per
// peer address) beyond their limits are rejected at once; one that does not
// log in within handshake_timeout is cut off; a wrong key or a replayed
// proof (the daemon's nonce is fresh for each connection) is refused. A
// client that answers no ping is let go: one whose host went away without a
// word would otherwise hold its session until TCP gives up (many minutes).
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "client/auth.h"
#include "runtime/ingress/session.h"

namespace moed::runtime::ingress {

struct NetworkOptions {
  std::vector<std::string> listen;  // HOST:PORT each, this rank's own port
  wire::Key key;
  std::string transports;           // UCX_TLS syntax; "" for UCX's choice
  std::chrono::milliseconds handshake_timeout{5000};
  // A client not heard from for ping_interval is pinged; one that answers
  // nothing for silence_timeout more is let go (its host is gone, or it
  // does not call the library; the library connects again at its next call).
  std::chrono::milliseconds ping_interval{10'000};
  std::chrono::milliseconds silence_timeout{60'000};
  int max_handshakes = 64;          // in progress at once
  int max_handshakes_per_peer = 8;  // in progress at once from one address
};

struct NetworkCounters {
  std::uint64_t connections = 0;         // accepted by the listener since start
  std::uint64_t logged_in = 0;           // proved the key
  std::uint64_t auth_failures = 0;       // a wrong proof (wrong key, replay) or no proof
  std::uint64_t handshake_timeouts = 0;  // did not log in in time
  std::uint64_t handshakes_refused = 0;  // over max_handshakes (per peer or in all)
  std::uint64_t silences = 0;            // clients let go for answering no ping
  std::uint64_t endpoints = 0;           // open now, logged in or not
  std::uint64_t outstanding = 0;         // UCX operations in flight now
};

// The addresses rank `rank` listens on for [ingress].listen = "HOST:PORT,
// ...": each port plus the rank (so that ranks sharing a host do not
// collide), port 0 left as is (any). Throws a Usage error naming the entry.
std::vector<std::string> rank_listen_addresses(const std::string& listen, int rank);

class NetworkDoor {
 public:
  // Listens and starts the thread; throws a moed::Error naming the address.
  NetworkDoor(NetworkOptions options, Desk& desk, const std::string& rank_name);
  // Sends what was posted (the shutting_down answers), then closes every
  // connection.
  ~NetworkDoor();
  NetworkDoor(const NetworkDoor&) = delete;
  NetworkDoor& operator=(const NetworkDoor&) = delete;

  // Where clients reach this rank, ports resolved ("10.0.0.1:7401"); a
  // wildcard address ("*") is listed as each IPv4 interface's, loopback last.
  const std::vector<std::string>& addresses() const;
  NetworkCounters counters() const;

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace moed::runtime::ingress
