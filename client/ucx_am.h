// The front door's frames over the network: one UCX worker that carries a
// frame (client/protocol.h) as each active message's header and rows as its
// data, received straight into the slot they belong to (UCX's rendezvous
// reads large data into it; small data is copied once, out of UCX's buffer).
// The client library and the daemon's network door both build on it.
//
// Single-threaded, except signal(): one thread creates the worker, calls
// every other member, and sees what arrives as events after progress().
// UCX picks the transport (TCP here; RDMA where the fabric has it) and the
// connection is made over sockaddr (ucp_listener, ucp_ep_create).
#pragma once

#include <netinet/in.h>
#include <sys/socket.h>
#include <ucp/api/ucp.h>

#include <cstddef>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "client/protocol.h"

namespace moed::netio {

// A UCX failure, naming the call.
class UcxError : public std::runtime_error {
 public:
  UcxError(const std::string& call, ucs_status_t status);
  ucs_status_t status() const { return status_; }

 private:
  ucs_status_t status_;
};

// An IPv4 or IPv6 address and port.
struct SocketAddress {
  sockaddr_storage storage{};
  socklen_t length = 0;
  std::string text() const;  // "10.0.0.1:7400", "[::1]:7400"
};
// "HOST:PORT" or "[V6]:PORT" resolved (getaddrinfo); "*:PORT" is every
// IPv4 interface. Throws std::runtime_error naming the text.
SocketAddress resolve(const std::string& host_port);

// Where an arriving message's data goes: `at`, kept alive by `keep` until
// the data has landed; `at` null: drop the data.
struct Placement {
  std::byte* at = nullptr;
  std::shared_ptr<void> keep;
  std::string refusal;  // at null: why (the frame's event carries it as `error`)
};

struct Event {
  enum class Kind { frame, lost, connection };
  Kind kind = Kind::frame;
  ucp_ep_h ep = nullptr;
  wire::Frame frame;             // frame: what arrived
  bool data_ok = true;           // frame: its data (if any) landed whole
  std::size_t data_bytes = 0;    // frame: how much data came with it
  std::string error;             // frame: the header was not a frame, or its placement's refusal; lost: why
  ucp_conn_request_h request = nullptr;  // connection: accept or reject it
  ucp_listener_h listener = nullptr;     // connection: the listener it came to
  SocketAddress peer;            // connection: who asks
};

class AmWorker {
 public:
  // `place` says where a frame's data goes (called inside progress()).
  using Place = std::function<Placement(ucp_ep_h from, const wire::Frame& frame, std::size_t bytes)>;
  // `transports`: UCX_TLS syntax for this worker alone ("" keeps UCX's own choice).
  AmWorker(const std::string& name, const std::string& transports, Place place);
  ~AmWorker();  // closes every endpoint at once (no flush)
  AmWorker(const AmWorker&) = delete;
  AmWorker& operator=(const AmWorker&) = delete;

  // Listens on `address` (port 0: any); the port bound.
  int listen(const SocketAddress& address);
  // Stops listening (connections now are refused); endpoints stay.
  void stop_listening();
  ucp_ep_h accept(ucp_conn_request_h request);
  void reject(const Event& connection);
  ucp_ep_h connect(const SocketAddress& address);
  // Closes an endpoint: `flush` lets what was sent go out first. Its
  // events stop; its sends and receives end.
  void close(ucp_ep_h ep, bool flush);

  // Sends one frame, with `bytes` of data from `data`; `keep` holds the data
  // alive until it has gone. A failure shows as the endpoint's lost event.
  void send(ucp_ep_h ep, std::vector<std::byte> frame, const void* data = nullptr, std::size_t bytes = 0,
            std::shared_ptr<void> keep = {});

  // Moves the worker along; true when something happened.
  bool progress();
  // What arrived since the last call, in order.
  std::deque<Event> take_events();
  // Blocks until UCX has something for progress(), signal() is called, or
  // `timeout_ms` passes (< 0: no limit).
  void wait(int timeout_ms);
  // Wakes wait(); any thread.
  void signal();
  // For waiting on several workers at once: arm() says whether the worker
  // may sleep (false: progress first), then poll fd() for POLLIN.
  bool arm();
  int fd() const;

  // Operations still in UCX's hands (sends, receives, closes): 0 once a
  // client or session has left nothing behind.
  std::size_t outstanding() const;
  std::size_t endpoints() const;

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace moed::netio
