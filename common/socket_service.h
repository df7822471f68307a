// A Unix-socket service: one thread running one poll() loop over a private
// listening socket (common/unix_socket.h) and its connections. The admin
// socket and the front door are both built on it: the service owns the
// listener, the wake-up, the poll set and the connections; a Handler says
// what the connections mean.
//
// Each turn: poll; if woken, the handler's woken(); every connection is
// served (handed its revents, 0 when it was not ready: work left from the
// last turn may be done) and says whether it stays; then every pending
// connection is accepted and admitted:
//   - a peer of another uid (root excepted) is refused: the handler sends it
//     its one refusal message, then it is closed;
//   - past max_clients the handler may name a connection to evict for it,
//     else the newcomer is refused the same way;
//   - the rest become connections (the handler's admit).
// When accept() fails for want of fds the listener stays readable: it is
// left out of the poll for a moment instead of spinning.
//
// Errors: a connection's hook (admit, serve, closed) that throws anything is
// logged with the service's name and the connection's serial and pid, and
// closes only that connection. A poll() that fails (other than EINTR) or any
// other hook that throws is logged, counted, and the loop pauses briefly and
// goes on: nothing here may take the daemon down.
#pragma once

#include <poll.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "common/unique_fd.h"
#include "common/unix_socket.h"

namespace moed {

// Wakes a poll loop from any thread (an eventfd). Shared: a waker may
// outlive the loop, and then wakes nobody.
class WakeUp {
 public:
  WakeUp();  // throws Runtime when the kernel gives no eventfd
  int fd() const { return fd_.get(); }
  void wake() const;
  // The loop, before it looks at what woke it.
  void clear() const;

 private:
  UniqueFd fd_;
};

// One connection of a service: its socket, its peer, and its serial (1, 2,
// ... in admission order). A server derives its per-connection state from it.
class SocketConnection {
 public:
  SocketConnection(UniqueFd fd, std::uint64_t serial, PeerCredentials peer)
      : fd_(std::move(fd)), serial_(serial), peer_(peer) {}
  virtual ~SocketConnection() = default;
  SocketConnection(const SocketConnection&) = delete;
  SocketConnection& operator=(const SocketConnection&) = delete;

  int fd() const { return fd_.get(); }
  std::uint64_t serial() const { return serial_; }
  const PeerCredentials& peer() const { return peer_; }

 private:
  UniqueFd fd_;
  std::uint64_t serial_;
  PeerCredentials peer_;
};

using SocketConnections = std::vector<std::shared_ptr<SocketConnection>>;

enum class Refusal {
  forbidden,  // the peer's uid may not use the socket
  full,       // max_clients are connected
};

struct SocketServiceCounters {
  std::uint64_t turns = 0;              // poll()s that returned: an idle service must not spin
  std::uint64_t loop_errors = 0;        // turns that failed (poll() among them), each logged
  std::uint64_t connection_errors = 0;  // connections closed because one of their hooks threw
  std::uint64_t connections = 0;        // held now (admitted, not yet closed): what a test waits on
};

class SocketService {
 public:
  // Called on the loop thread only. The hooks that see the connections get
  // them as the service holds them; none may add or remove one.
  class Handler {
   public:
    virtual ~Handler() = default;
    // Tells a newcomer why it is refused, in the server's own words: one
    // short message, best effort, without blocking. It is closed after.
    virtual void refuse(int fd, Refusal why, const PeerCredentials& peer) = 0;
    // Every slot is taken: the connection to close for the newcomer (told
    // why by this call), or nullptr to refuse the newcomer.
    virtual SocketConnection* evictee(const SocketConnections&) { return nullptr; }
    // A newcomer admitted: the connection to serve from the next turn on.
    virtual std::shared_ptr<SocketConnection> admit(UniqueFd fd, std::uint64_t serial,
                                                    const PeerCredentials& peer) = 0;
    // What to poll a connection for (POLLIN, POLLOUT); hang-ups and errors always come.
    virtual short events(SocketConnection&) { return POLLIN; }
    // One turn of a connection; false closes it.
    virtual bool serve(SocketConnection&, short revents) = 0;
    // A connection has left the service while it runs (served to its end,
    // evicted, or failed); the service has let go of it.
    virtual void closed(SocketConnection&) {}
    // How long the next poll() may wait, in ms: the handler's nearest deadline.
    virtual int poll_timeout_ms(const SocketConnections&) = 0;
    // Someone called wake().
    virtual void woken(const SocketConnections&) {}
  };

  // Binds the listening socket `path` in `dir` (ListeningSocket: throws a
  // moed::Error naming it); `handler` must outlive the service. Nothing is
  // served before start().
  SocketService(const std::string& dir, const std::string& path, const SocketNames& names, Handler& handler,
                int max_clients);
  // stop(), then closes every connection and removes the socket file.
  ~SocketService();
  SocketService(const SocketService&) = delete;
  SocketService& operator=(const SocketService&) = delete;

  // Runs the loop on a thread of its own; the handler is called from there on.
  void start();
  // Ends the loop and joins its thread (later calls do nothing). After it,
  // the caller may use connections() and the handler's state freely.
  void stop();
  // Any thread: the current poll returns and the handler's woken() runs.
  void wake() const { wake_up_->wake(); }
  // For wakers that may outlive the service.
  std::shared_ptr<const WakeUp> wake_up() const { return wake_up_; }

  const std::string& path() const { return listener_.path(); }
  // On the loop thread (from the hooks), or after stop().
  const SocketConnections& connections() const { return connections_; }
  // Any thread.
  SocketServiceCounters counters() const;

 private:
  void run();
  void turn();
  int poll_timeout_ms();
  bool serve(SocketConnection& c, short revents);
  void close(const std::shared_ptr<SocketConnection>& c);
  void accept_all();
  void admit(UniqueFd fd);

  SocketNames names_;
  Handler& handler_;
  const int max_clients_;
  ListeningSocket listener_;
  std::shared_ptr<WakeUp> wake_up_ = std::make_shared<WakeUp>();
  SocketConnections connections_;
  std::uint64_t next_serial_ = 1;
  std::chrono::steady_clock::time_point accept_paused_until_{};
  std::atomic<bool> stop_{false};
  std::atomic<std::uint64_t> turns_{0}, loop_errors_{0}, connection_errors_{0}, connections_held_{0};
  std::thread thread_;
};

}  // namespace moed
