#include "runtime/control/admin_server.h"

#include <poll.h>
#include <spdlog/spdlog.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <deque>
#include <mutex>
#include <optional>
#include <vector>

#include "common/socket_service.h"

namespace moed::runtime::admin {
namespace {

using Clock = std::chrono::steady_clock;

constexpr std::size_t kReadChunk = 16 * 1024;
constexpr int kLinesPerTurn = 32;    // lines handled per client per loop turn (fairness)
constexpr int kMaxPollWaitMs = 1000;

// ---- Replies from other threads ------------------------------------------

// Shared with every Reply handed to the daemon, so a reply that comes after the
// server has gone is dropped instead of touching freed memory.
class Mailbox {
 public:
  struct Letter {
    std::uint64_t client;
    std::uint64_t ticket;
    std::string line;
  };

  explicit Mailbox(std::shared_ptr<const WakeUp> wake_up) : wake_up_(std::move(wake_up)) {}

  void post(Letter letter) {
    {
      std::lock_guard lock(mutex_);
      if (closed_) return;
      letters_.push_back(std::move(letter));
    }
    wake_up_->wake();
  }
  std::vector<Letter> take() {
    std::lock_guard lock(mutex_);
    std::vector<Letter> out;
    out.swap(letters_);
    return out;
  }
  void close() {
    std::lock_guard lock(mutex_);
    closed_ = true;
    letters_.clear();
  }

 private:
  std::shared_ptr<const WakeUp> wake_up_;
  std::mutex mutex_;
  bool closed_ = false;
  std::vector<Letter> letters_;
};

// ---- Connections -----------------------------------------------------------

// One answer to come, in request order: ready at once, or awaiting a reply.
struct Slot {
  std::uint64_t ticket = 0;
  bool ready = false;
  std::string line;
};

struct Client : SocketConnection {
  using SocketConnection::SocketConnection;
  std::string in;        // bytes read, not yet handled
  std::size_t scan = 0;  // in[..scan) past the first unhandled line holds no '\n'
  std::string out;       // bytes to write
  std::size_t out_off = 0;
  std::deque<Slot> slots;
  std::size_t held_bytes = 0;  // ready lines waiting behind an unready slot
  std::uint64_t next_ticket = 1;
  int in_flight = 0;
  bool backlog = false;      // complete lines left for the next turn
  bool read_closed = false;  // EOF seen (half-close)
  bool closing = false;      // read nothing more; close once everything is written
  bool dead = false;         // close now
  Clock::time_point last_activity = Clock::now();
  std::optional<Clock::time_point> line_started;  // the unfinished line's first byte

  std::size_t pending_bytes() const { return out.size() - out_off + held_bytes; }
  bool drained() const { return slots.empty() && out_off == out.size(); }
};

// Every connection of the admin socket is a Client: admit makes them.
Client& client(SocketConnection& c) { return static_cast<Client&>(c); }

// Best effort, for a connection about to be closed: a fresh socket's buffer
// takes a short line whole.
void send_final_line(int fd, const std::string& line) {
  const std::string data = line + "\n";
  [[maybe_unused]] auto n = ::send(fd, data.data(), data.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
}

// Keeps framing intact whatever a handler returns: one answer, one line.
std::string one_line(std::string line) {
  while (!line.empty() && (line.back() == '\n' || line.back() == '\r')) line.pop_back();
  std::replace(line.begin(), line.end(), '\n', ' ');
  return line;
}

}  // namespace

struct AdminServer::Impl final : SocketService::Handler {
  std::string dir, path;
  int rank;
  std::atomic<int> coordinator{0};  // set by the step thread after a loss, read by the server's
  Handlers handlers;
  Limits limits;
  std::unique_ptr<SocketService> service;
  std::shared_ptr<Mailbox> mailbox;

  struct AtomicCounters {
    std::atomic<std::uint64_t> accepted{0}, refused_uid{0}, refused_full{0}, requests{0},
        lines_too_long{0}, dropped_slow{0}, closed_idle{0}, closed_slow_line{0}, evicted{0}, bytes_read{0};
  } counters;

  // SocketService::Handler, on the server thread.
  void refuse(int fd, Refusal why, const PeerCredentials& peer) override;
  SocketConnection* evictee(const SocketConnections& all) override;
  std::shared_ptr<SocketConnection> admit(UniqueFd fd, std::uint64_t serial, const PeerCredentials& peer) override;
  short events(SocketConnection& c) override;
  bool serve(SocketConnection& c, short revents) override;
  int poll_timeout_ms(const SocketConnections& all) override;
  void woken(const SocketConnections& all) override { deliver(all, mailbox->take()); }

  std::size_t read_from(Client& c);
  void handle_lines(Client& c);
  void handle_line(Client& c, std::string_view line);
  void answer_now(Client& c, std::string line);
  void submit(Client& c, Request request);
  void deliver(const SocketConnections& all, std::vector<Mailbox::Letter> letters);
  void release_ready(Client& c);
  void write_to(Client& c);
  bool stays_open(Client& c);
  void shut_down_clients();
};

int AdminServer::Impl::poll_timeout_ms(const SocketConnections& all) {
  const auto now = Clock::now();
  auto wait = std::chrono::milliseconds(kMaxPollWaitMs);
  for (const auto& connection : all) {
    const Client& c = client(*connection);
    if (c.backlog) return 0;
    if (c.line_started) {
      const auto deadline = *c.line_started + std::chrono::milliseconds(limits.line_timeout_ms);
      wait = std::min(wait, std::chrono::duration_cast<std::chrono::milliseconds>(deadline - now) +
                                std::chrono::milliseconds(1));
    }
    if (c.in_flight > 0) continue;
    const auto deadline = c.last_activity + std::chrono::milliseconds(limits.idle_timeout_ms);
    wait = std::min(wait, std::chrono::duration_cast<std::chrono::milliseconds>(deadline - now) +
                              std::chrono::milliseconds(1));
  }
  return static_cast<int>(std::max<std::int64_t>(0, wait.count()));
}

short AdminServer::Impl::events(SocketConnection& connection) {
  const Client& c = client(connection);
  short events = 0;
  if (!c.read_closed && !c.closing && !c.backlog) events |= POLLIN;
  if (c.out_off < c.out.size()) events |= POLLOUT;
  return events;
}

// One turn of a client: what it sent, the answers it is owed, and whether it stays.
bool AdminServer::Impl::serve(SocketConnection& connection, short revents) {
  Client& c = client(connection);
  const std::size_t got = (revents & (POLLIN | POLLHUP | POLLERR)) ? read_from(c) : 0;
  if (c.backlog || !c.in.empty()) handle_lines(c);
  counters.bytes_read += got;  // after the lines: a test that sees the bytes sees what they did
  // POLLHUP: the peer closed both ways, so nothing can reach it any more.
  // What it sent has been handled (a fire-and-forget control command still
  // counts); without this, poll would report POLLHUP again at once, forever.
  if ((revents & (POLLHUP | POLLERR)) && !c.backlog && (c.read_closed || c.closing)) c.dead = true;
  write_to(c);
  return stays_open(c);
}

void AdminServer::Impl::refuse(int fd, Refusal why, const PeerCredentials& peer) {
  if (why == Refusal::forbidden) {
    ++counters.refused_uid;
    send_final_line(fd, answer_error(nullptr, code::kForbidden,
                                     fmt::format("uid {} may not use this admin socket; only uid {} or root may",
                                                 peer.uid, ::geteuid())));
    return;
  }
  ++counters.refused_full;
  send_final_line(fd, answer_error(nullptr, code::kTooManyClients,
                                   fmt::format("the admin socket serves at most {} clients at once; try again later",
                                               limits.max_clients)));
}

std::shared_ptr<SocketConnection> AdminServer::Impl::admit(UniqueFd fd, std::uint64_t serial,
                                                           const PeerCredentials& peer) {
  ++counters.accepted;
  return std::make_shared<Client>(std::move(fd), serial, peer);
}

// Frees a slot by closing the client whose unfinished line started first;
// nullptr when no client is in the middle of a line.
SocketConnection* AdminServer::Impl::evictee(const SocketConnections& all) {
  Client* oldest = nullptr;
  for (const auto& connection : all) {
    Client& c = client(*connection);
    if (c.line_started && !c.dead && (!oldest || *c.line_started < *oldest->line_started)) oldest = &c;
  }
  if (!oldest) return nullptr;
  ++counters.evicted;
  send_final_line(oldest->fd(),
                  answer_error(nullptr, code::kEvicted,
                               "every admin slot was taken: this connection's unfinished line gave its "
                               "slot to a new client"));
  return oldest;
}

// Returns the number of bytes read.
std::size_t AdminServer::Impl::read_from(Client& c) {
  if (c.read_closed || c.closing || c.dead) return 0;
  char buffer[kReadChunk];
  std::size_t got = 0;
  // A bounded number of reads per turn, so one fast client cannot starve others.
  for (int reads = 0; reads < 4 && c.in.size() <= limits.max_line; ++reads) {
    const ssize_t n = ::recv(c.fd(), buffer, sizeof buffer, MSG_DONTWAIT);
    if (n > 0) {
      if (c.in.empty()) c.line_started = Clock::now();
      c.in.append(buffer, static_cast<std::size_t>(n));
      c.last_activity = Clock::now();
      got += static_cast<std::size_t>(n);
      if (static_cast<std::size_t>(n) < sizeof buffer) return got;
      continue;
    }
    if (n == 0) {
      c.read_closed = true;
      return got;
    }
    if (errno == EINTR) continue;
    if (errno != EAGAIN && errno != EWOULDBLOCK) c.dead = true;  // reset by the peer
    return got;
  }
  return got;
}

// Handles up to kLinesPerTurn complete lines; the rest wait for the next turn.
void AdminServer::Impl::handle_lines(Client& c) {
  std::size_t begin = 0;
  int handled = 0;
  c.backlog = false;
  while (!c.closing && !c.dead) {
    const std::size_t newline = c.in.find('\n', std::max(begin, c.scan));
    if (newline == std::string::npos) {
      c.scan = c.in.size();
      break;
    }
    if (handled == kLinesPerTurn) {
      c.backlog = true;
      break;
    }
    const std::string_view line(c.in.data() + begin, newline - begin);
    begin = newline + 1;
    ++handled;
    handle_line(c, line);
  }
  if (c.closing || c.dead) {
    c.in.clear();
    c.scan = 0;
    c.backlog = false;
    c.line_started.reset();
    return;
  }
  c.in.erase(0, begin);
  c.scan = c.scan > begin ? c.scan - begin : 0;
  // What is left is the start of the next line; it arrived in the last read.
  if (c.in.empty()) {
    c.line_started.reset();
  } else if (begin > 0) {
    c.line_started = Clock::now();
  }
  if (c.backlog) return;
  // What is left has no newline: the start of a line still coming in.
  if (c.in.size() > limits.max_line) {
    ++counters.lines_too_long;
    answer_now(c, answer_error(nullptr, code::kLineTooLong,
                               fmt::format("request line longer than {} bytes", limits.max_line)));
    c.closing = true;
    c.in.clear();
    c.scan = 0;
  } else if (c.read_closed && !c.in.empty()) {
    // The peer ended the connection in the middle of a line: never act on it.
    answer_now(c, answer_error(nullptr, code::kBadJson,
                               "the connection ended in the middle of a line (no newline)"));
    c.in.clear();
    c.scan = 0;
  }
}

void AdminServer::Impl::handle_line(Client& c, std::string_view line) {
  if (is_blank(line)) return;
  ++counters.requests;
  auto parsed = parse_request(line, limits.max_line);
  if (auto* answer = std::get_if<Answer>(&parsed)) {
    if (answer->code == code::kLineTooLong) ++counters.lines_too_long;
    answer_now(c, std::move(answer->line));
    if (answer->close) c.closing = true;
    return;
  }
  Request& request = std::get<Request>(parsed);
  if (is_control(request.cmd)) {
    if (const int now = coordinator.load(); rank != now) {
      answer_now(c, answer_error(request.id, code::kNotCoordinator,
                                 fmt::format("'{}' is a control command: send it to the "
                                             "coordinator, rank {}, at {}",
                                             request.cmd, now, AdminServer::socket_path(dir, now))));
      return;
    }
    submit(c, std::move(request));
    return;
  }
  if (!handlers.snapshot_answer) {
    answer_now(c, answer_error(request.id, code::kInternal, "this daemon does not answer '" +
                                                                request.cmd + "' yet"));
    return;
  }
  std::string line_out;
  try {
    json body = handlers.snapshot_answer(request);
    if (body.is_object() && body.contains("ok") && body["ok"] == false) {
      const json& err = body.contains("error") ? body["error"] : json::object();
      const std::string error_code = err.is_object() ? err.value("code", std::string(code::kInternal))
                                                     : std::string(code::kInternal);
      const std::string message = err.is_object() ? err.value("message", std::string()) : "";
      line_out = answer_error(request.id, error_code, message);
    } else {
      line_out = answer_ok(request.id, std::move(body));
    }
  } catch (const std::exception& e) {
    line_out = answer_error(request.id, code::kInternal, e.what());
  } catch (...) {
    line_out = answer_error(request.id, code::kInternal, "the daemon failed to answer");
  }
  answer_now(c, std::move(line_out));
}

void AdminServer::Impl::submit(Client& c, Request request) {
  if (!handlers.submit) {
    answer_now(c, answer_error(request.id, code::kInternal,
                               "this daemon does not take '" + request.cmd + "' yet"));
    return;
  }
  if (c.in_flight >= limits.max_in_flight) {
    answer_now(c, answer_error(request.id, code::kTooManyRequests,
                               fmt::format("at most {} control requests in flight per connection",
                                           limits.max_in_flight)));
    return;
  }
  const std::uint64_t ticket = c.next_ticket++;
  c.slots.push_back(Slot{ticket, false, {}});
  ++c.in_flight;
  const json id = request.id;
  Reply reply = [mailbox = mailbox, client = c.serial(), ticket](std::string line) {
    mailbox->post({client, ticket, std::move(line)});
  };
  try {
    handlers.submit(std::move(request), std::move(reply));
  } catch (const std::exception& e) {
    mailbox->post({c.serial(), ticket, answer_error(id, code::kInternal, e.what())});
  } catch (...) {
    mailbox->post({c.serial(), ticket, answer_error(id, code::kInternal, "the daemon refused to queue it")});
  }
}

void AdminServer::Impl::answer_now(Client& c, std::string line) {
  c.slots.push_back(Slot{0, true, one_line(std::move(line))});
  c.held_bytes += c.slots.back().line.size() + 1;
  release_ready(c);
}

void AdminServer::Impl::deliver(const SocketConnections& all, std::vector<Mailbox::Letter> letters) {
  for (auto& letter : letters) {
    auto it = std::find_if(all.begin(), all.end(), [&](const auto& c) { return c->serial() == letter.client; });
    if (it == all.end()) continue;  // the client has gone: drop the reply
    Client& c = client(**it);
    for (auto& slot : c.slots) {
      if (slot.ticket != letter.ticket || slot.ready) continue;
      slot.ready = true;
      slot.line = one_line(std::move(letter.line));
      c.held_bytes += slot.line.size() + 1;
      --c.in_flight;
      c.last_activity = Clock::now();
      break;
    }
    release_ready(c);
  }
}

// Moves the ready answers at the front of the queue to the output buffer, and
// drops a client whose unread answers pass the limit.
void AdminServer::Impl::release_ready(Client& c) {
  while (!c.slots.empty() && c.slots.front().ready) {
    Slot& slot = c.slots.front();
    c.held_bytes -= slot.line.size() + 1;
    c.out += slot.line;
    c.out += '\n';
    c.slots.pop_front();
  }
  if (!c.dead && c.pending_bytes() > limits.max_pending_bytes) {
    ++counters.dropped_slow;
    spdlog::warn("admin socket: dropped a client that does not read its answers ({} bytes queued)",
                 c.pending_bytes());
    c.dead = true;
  }
}

void AdminServer::Impl::write_to(Client& c) {
  while (!c.dead && c.out_off < c.out.size()) {
    const ssize_t n = ::send(c.fd(), c.out.data() + c.out_off, c.out.size() - c.out_off,
                             MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n > 0) {
      c.out_off += static_cast<std::size_t>(n);
      c.last_activity = Clock::now();
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
    c.dead = true;  // EPIPE, ECONNRESET: the peer has gone
  }
  if (c.out_off == c.out.size()) {
    c.out.clear();
    c.out_off = 0;
  } else if (c.out_off > 64 * 1024 && c.out_off > c.out.size() / 2) {
    c.out.erase(0, c.out_off);
    c.out_off = 0;
  }
}

// Whether a client stays after its turn: not once it has gone, finished, idled or dribbled too long.
bool AdminServer::Impl::stays_open(Client& c) {
  if (c.dead) return false;
  if ((c.closing || c.read_closed) && !c.backlog && c.drained()) return false;
  const auto now = Clock::now();
  if (c.in_flight == 0 && now - c.last_activity > std::chrono::milliseconds(limits.idle_timeout_ms)) {
    ++counters.closed_idle;
    return false;
  }
  if (c.line_started && !c.backlog && now - *c.line_started > std::chrono::milliseconds(limits.line_timeout_ms)) {
    ++counters.closed_slow_line;
    send_final_line(c.fd(), answer_error(nullptr, code::kLineTimeout,
                                         fmt::format("a request line must end (newline) within {} ms of its first byte",
                                                     limits.line_timeout_ms)));
    return false;
  }
  return true;
}

// After the loop has stopped: control requests still waiting get shutting_down.
void AdminServer::Impl::shut_down_clients() {
  for (const auto& connection : service->connections()) {
    Client& c = client(*connection);
    for (auto& slot : c.slots) {
      if (slot.ready) continue;
      slot.ready = true;
      slot.line = answer_error(nullptr, code::kShuttingDown, "the daemon stopped before deciding this request");
      c.held_bytes += slot.line.size() + 1;
    }
    release_ready(c);
    if (!c.dead) write_to(c);
  }
}

void AdminServer::set_coordinator(int rank) { impl_->coordinator.store(rank); }

AdminServer::AdminServer(const std::string& dir, int rank, int coordinator_rank, Handlers handlers,
                         Limits limits)
    : impl_(std::make_unique<Impl>()) {
  Impl& m = *impl_;
  m.dir = dir;
  m.path = socket_path(dir, rank);
  m.rank = rank;
  m.coordinator = coordinator_rank;
  m.handlers = std::move(handlers);
  m.limits = limits;
  m.service = std::make_unique<SocketService>(dir, m.path, SocketNames{"admin socket", "[admin].dir"}, m,
                                              limits.max_clients);
  m.mailbox = std::make_shared<Mailbox>(m.service->wake_up());
  m.service->start();
  spdlog::debug("admin socket: listening on {}", m.path);
}

AdminServer::~AdminServer() {
  Impl& m = *impl_;
  m.service->stop();
  try {
    m.deliver(m.service->connections(), m.mailbox->take());
    m.shut_down_clients();
  } catch (const std::exception& e) {
    spdlog::error("admin socket: {}", e.what());
  } catch (...) {
    spdlog::error("admin socket: an exception that is not a std::exception while shutting down");
  }
  m.mailbox->close();
  m.service.reset();  // closes every connection and removes the socket file
}

const std::string& AdminServer::path() const { return impl_->path; }

AdminCounters AdminServer::counters() const {
  const auto& a = impl_->counters;
  const SocketServiceCounters service = impl_->service->counters();
  return AdminCounters{a.accepted.load(),       a.refused_uid.load(),      a.refused_full.load(),
                       a.requests.load(),       a.lines_too_long.load(),   a.dropped_slow.load(),
                       a.closed_idle.load(),    a.closed_slow_line.load(), a.evicted.load(),
                       service.turns,           service.connections,       a.bytes_read.load()};
}

std::string AdminServer::socket_path(const std::string& dir, int rank) {
  return admin::socket_path(dir, rank);
}

}  // namespace moed::runtime::admin
