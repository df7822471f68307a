#include "runtime/control/admin_server.h"

#include <fcntl.h>
#include <poll.h>
#include <spdlog/spdlog.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <optional>
#include <cstring>
#include <deque>
#include <mutex>
#include <thread>
#include <vector>

#include "common/error.h"
#include "common/unix_socket.h"
#include "common/unique_fd.h"

namespace moed::runtime::admin {
namespace {

using Clock = std::chrono::steady_clock;

constexpr std::size_t kReadChunk = 16 * 1024;
constexpr int kLinesPerTurn = 32;    // lines handled per client per loop turn (fairness)
constexpr int kMaxPollWaitMs = 1000;

std::string errno_text(int err) { return std::strerror(err); }

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

  Mailbox() : event_(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)) {
    if (!event_) MOED_THROW(Runtime, "eventfd(): {}", errno_text(errno));
  }
  int fd() const { return event_.get(); }

  void post(Letter letter) {
    {
      std::lock_guard lock(mutex_);
      if (closed_) return;
      letters_.push_back(std::move(letter));
    }
    wake();
  }
  void wake() {
    const std::uint64_t one = 1;
    // Fails only when the counter would overflow, i.e. a wake-up is pending anyway.
    [[maybe_unused]] auto n = ::write(event_.get(), &one, sizeof one);
  }
  // Resets the eventfd and takes every letter.
  std::vector<Letter> take() {
    std::uint64_t count;
    [[maybe_unused]] auto n = ::read(event_.get(), &count, sizeof count);
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
  UniqueFd event_;
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

struct Client {
  UniqueFd fd;
  std::uint64_t serial = 0;
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

struct AdminServer::Impl {
  std::string dir, path;
  int rank, coordinator;
  Handlers handlers;
  Limits limits;
  std::unique_ptr<ListeningSocket> listener;
  std::shared_ptr<Mailbox> mailbox = std::make_shared<Mailbox>();
  std::atomic<bool> stop{false};
  std::vector<std::unique_ptr<Client>> clients;
  std::uint64_t next_serial = 1;
  Clock::time_point accept_paused_until{};
  std::thread thread;

  struct AtomicCounters {
    std::atomic<std::uint64_t> accepted{0}, refused_uid{0}, refused_full{0}, requests{0},
        lines_too_long{0}, dropped_slow{0}, closed_idle{0}, closed_slow_line{0}, evicted{0}, turns{0};
  } counters;

  void run();
  void turn();
  int poll_timeout_ms() const;
  void accept_all();
  void admit(UniqueFd fd);
  bool evict_oldest_partial_line();
  void read_from(Client& c);
  void handle_lines(Client& c);
  void handle_line(Client& c, std::string_view line);
  void answer_now(Client& c, std::string line);
  void submit(Client& c, Request request);
  void deliver(std::vector<Mailbox::Letter> letters);
  void release_ready(Client& c);
  void write_to(Client& c);
  void reap();
  void shut_down_clients();
};

void AdminServer::Impl::run() {
  while (!stop.load()) {
    try {
      turn();
    } catch (const std::exception& e) {
      // Nothing here may take the daemon down; pause so a persistent failure
      // does not spin.
      spdlog::error("admin socket: {}", e.what());
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    } catch (...) {
      spdlog::error("admin socket: unknown exception");
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  }
  try {
    deliver(mailbox->take());
    shut_down_clients();
  } catch (const std::exception& e) {
    spdlog::error("admin socket: {}", e.what());
  }
}

int AdminServer::Impl::poll_timeout_ms() const {
  const auto now = Clock::now();
  auto wait = std::chrono::milliseconds(kMaxPollWaitMs);
  if (now < accept_paused_until)
    wait = std::chrono::duration_cast<std::chrono::milliseconds>(accept_paused_until - now) +
           std::chrono::milliseconds(1);
  for (const auto& c : clients) {
    if (c->backlog) return 0;
    if (c->line_started) {
      const auto deadline = *c->line_started + std::chrono::milliseconds(limits.line_timeout_ms);
      wait = std::min(wait, std::chrono::duration_cast<std::chrono::milliseconds>(deadline - now) +
                                std::chrono::milliseconds(1));
    }
    if (c->in_flight > 0) continue;
    const auto deadline = c->last_activity + std::chrono::milliseconds(limits.idle_timeout_ms);
    wait = std::min(wait, std::chrono::duration_cast<std::chrono::milliseconds>(deadline - now) +
                              std::chrono::milliseconds(1));
  }
  return static_cast<int>(std::max<std::int64_t>(0, wait.count()));
}

// One poll and everything that follows from it.
void AdminServer::Impl::turn() {
  std::vector<pollfd> fds;
  fds.push_back({mailbox->fd(), POLLIN, 0});
  // While accept() fails for lack of fds, the listener stays readable: leave
  // it out of the poll for a moment rather than spin.
  const bool accepting = Clock::now() >= accept_paused_until;
  fds.push_back({listener->fd(), static_cast<short>(accepting ? POLLIN : 0), 0});
  for (const auto& c : clients) {
    short events = 0;
    if (!c->read_closed && !c->closing && !c->backlog) events |= POLLIN;
    if (c->out_off < c->out.size()) events |= POLLOUT;
    fds.push_back({c->fd.get(), events, 0});
  }
  const int ready = ::poll(fds.data(), fds.size(), poll_timeout_ms());
  if (ready < 0) {
    if (errno == EINTR) return;
    MOED_THROW(Runtime, "poll(): {}", errno_text(errno));
  }
  ++counters.turns;
  if (stop.load()) return;

  if (fds[0].revents & POLLIN) deliver(mailbox->take());
  // Clients first (their indices match fds), then new connections.
  const std::size_t known = fds.size() - 2;
  for (std::size_t i = 0; i < known; ++i) {
    Client& c = *clients[i];
    const short revents = fds[i + 2].revents;
    if (revents & (POLLIN | POLLHUP | POLLERR)) read_from(c);
    if (c.backlog || !c.in.empty()) handle_lines(c);
    // POLLHUP: the peer closed both ways, so nothing can reach it any more.
    // What it sent has been handled (a fire-and-forget control command still
    // counts); without this, poll would report POLLHUP again at once, forever.
    if ((revents & (POLLHUP | POLLERR)) && !c.backlog && (c.read_closed || c.closing))
      c.dead = true;
  }
  if (fds[1].revents & POLLIN) accept_all();
  for (const auto& c : clients) write_to(*c);
  reap();
}

void AdminServer::Impl::accept_all() {
  for (;;) {
    int error = 0;
    UniqueFd fd = listener->accept(error);
    if (!fd) {
      if (error == 0) return;
      // EMFILE and the like: leave the rest in the backlog for a later turn.
      spdlog::warn("admin socket: accept(): {}", errno_text(error));
      accept_paused_until = Clock::now() + std::chrono::milliseconds(200);
      return;
    }
    admit(std::move(fd));
  }
}

void AdminServer::Impl::admit(UniqueFd fd) {
  PeerCredentials cred;
  try {
    cred = peer_credentials(fd.get());
  } catch (const Error& e) {
    spdlog::warn("admin socket: {}", e.what());
    return;
  }
  const uid_t self = ::geteuid();
  if (!peer_may_connect(cred.uid)) {
    ++counters.refused_uid;
    spdlog::warn("admin socket {}: refused a connection from uid {} (pid {}): only uid {} or root",
                 path, cred.uid, cred.pid, self);
    send_final_line(fd.get(), answer_error(nullptr, code::kForbidden,
                                           fmt::format("uid {} may not use this admin socket; "
                                                       "only uid {} or root may",
                                                       cred.uid, self)));
    return;
  }
  if (static_cast<int>(clients.size()) >= limits.max_clients && !evict_oldest_partial_line()) {
    ++counters.refused_full;
    send_final_line(fd.get(), answer_error(nullptr, code::kTooManyClients,
                                           fmt::format("the admin socket serves at most {} "
                                                       "clients at once; try again later",
                                                       limits.max_clients)));
    return;
  }
  ++counters.accepted;
  auto client = std::make_unique<Client>();
  client->fd = std::move(fd);
  client->serial = next_serial++;
  clients.push_back(std::move(client));
}

// Frees a slot by closing the client whose unfinished line started first;
// false when no client is in the middle of a line.
bool AdminServer::Impl::evict_oldest_partial_line() {
  Client* oldest = nullptr;
  for (const auto& c : clients)
    if (c->line_started && !c->dead && (!oldest || *c->line_started < *oldest->line_started)) oldest = c.get();
  if (!oldest) return false;
  ++counters.evicted;
  send_final_line(oldest->fd.get(),
                  answer_error(nullptr, code::kEvicted,
                               "every admin slot was taken: this connection's unfinished line gave its "
                               "slot to a new client"));
  std::erase_if(clients, [&](const std::unique_ptr<Client>& c) { return c.get() == oldest; });
  return true;
}

void AdminServer::Impl::read_from(Client& c) {
  if (c.read_closed || c.closing || c.dead) return;
  char buffer[kReadChunk];
  // A bounded number of reads per turn, so one fast client cannot starve others.
  for (int reads = 0; reads < 4 && c.in.size() <= limits.max_line; ++reads) {
    const ssize_t n = ::recv(c.fd.get(), buffer, sizeof buffer, MSG_DONTWAIT);
    if (n > 0) {
      if (c.in.empty()) c.line_started = Clock::now();
      c.in.append(buffer, static_cast<std::size_t>(n));
      c.last_activity = Clock::now();
      if (static_cast<std::size_t>(n) < sizeof buffer) return;
      continue;
    }
    if (n == 0) {
      c.read_closed = true;
      return;
    }
    if (errno == EINTR) continue;
    if (errno != EAGAIN && errno != EWOULDBLOCK) c.dead = true;  // reset by the peer
    return;
  }
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
    if (rank != coordinator) {
      answer_now(c, answer_error(request.id, code::kNotCoordinator,
                                 fmt::format("'{}' is a control command: send it to the "
                                             "coordinator, rank {}, at {}",
                                             request.cmd, coordinator,
                                             AdminServer::socket_path(dir, coordinator))));
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
  Reply reply = [mailbox = mailbox, client = c.serial, ticket](std::string line) {
    mailbox->post({client, ticket, std::move(line)});
  };
  try {
    handlers.submit(std::move(request), std::move(reply));
  } catch (const std::exception& e) {
    mailbox->post({c.serial, ticket, answer_error(id, code::kInternal, e.what())});
  } catch (...) {
    mailbox->post({c.serial, ticket, answer_error(id, code::kInternal, "the daemon refused to queue it")});
  }
}

void AdminServer::Impl::answer_now(Client& c, std::string line) {
  c.slots.push_back(Slot{0, true, one_line(std::move(line))});
  c.held_bytes += c.slots.back().line.size() + 1;
  release_ready(c);
}

void AdminServer::Impl::deliver(std::vector<Mailbox::Letter> letters) {
  for (auto& letter : letters) {
    auto it = std::find_if(clients.begin(), clients.end(),
                           [&](const auto& c) { return c->serial == letter.client; });
    if (it == clients.end()) continue;  // the client has gone: drop the reply
    Client& c = **it;
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
    const ssize_t n = ::send(c.fd.get(), c.out.data() + c.out_off, c.out.size() - c.out_off,
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

void AdminServer::Impl::reap() {
  const auto now = Clock::now();
  const auto idle = std::chrono::milliseconds(limits.idle_timeout_ms);
  const auto line_limit = std::chrono::milliseconds(limits.line_timeout_ms);
  std::erase_if(clients, [&](const std::unique_ptr<Client>& c) {
    if (c->dead) return true;
    if ((c->closing || c->read_closed) && !c->backlog && c->drained()) return true;
    if (c->in_flight == 0 && now - c->last_activity > idle) {
      ++counters.closed_idle;
      return true;
    }
    if (c->line_started && !c->backlog && now - *c->line_started > line_limit) {
      ++counters.closed_slow_line;
      send_final_line(c->fd.get(), answer_error(nullptr, code::kLineTimeout,
                                                fmt::format("a request line must end (newline) within {} ms of "
                                                            "its first byte",
                                                            limits.line_timeout_ms)));
      return true;
    }
    return false;
  });
}

void AdminServer::Impl::shut_down_clients() {
  for (auto& c : clients) {
    for (auto& slot : c->slots) {
      if (slot.ready) continue;
      slot.ready = true;
      slot.line = answer_error(nullptr, code::kShuttingDown,
                               "the daemon stopped before deciding this request");
      c->held_bytes += slot.line.size() + 1;
    }
    release_ready(*c);
    if (!c->dead) write_to(*c);
  }
  clients.clear();
}

AdminServer::AdminServer(const std::string& dir, int rank, int coordinator_rank, Handlers handlers,
                         Limits limits)
    : impl_(std::make_unique<Impl>()) {
  impl_->dir = dir;
  impl_->path = socket_path(dir, rank);
  impl_->rank = rank;
  impl_->coordinator = coordinator_rank;
  impl_->handlers = std::move(handlers);
  impl_->limits = limits;
  impl_->listener = std::make_unique<ListeningSocket>(dir, impl_->path, SocketNames{"admin socket", "[admin].dir"});
  impl_->thread = std::thread([impl = impl_.get()] { impl->run(); });
  spdlog::debug("admin socket: listening on {}", impl_->path);
}

AdminServer::~AdminServer() {
  impl_->stop.store(true);
  impl_->mailbox->wake();
  if (impl_->thread.joinable()) impl_->thread.join();
  impl_->mailbox->close();
  impl_->listener.reset();  // closes it and removes the socket file
}

const std::string& AdminServer::path() const { return impl_->path; }

AdminCounters AdminServer::counters() const {
  const auto& a = impl_->counters;
  return AdminCounters{a.accepted.load(),       a.refused_uid.load(),   a.refused_full.load(),
                       a.requests.load(),       a.lines_too_long.load(), a.dropped_slow.load(),
                       a.closed_idle.load(),    a.closed_slow_line.load(), a.evicted.load(),
                       a.turns.load()};
}

std::string AdminServer::socket_path(const std::string& dir, int rank) {
  return admin::socket_path(dir, rank);
}

}  // namespace moed::runtime::admin
