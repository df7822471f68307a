#include "runtime/observe/http/http_server.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <limits>
#include <mutex>
#include <optional>
#include <string_view>
#include <thread>
#include <unordered_map>

#include <fmt/format.h>

#include "common/error.h"
#include "common/tcp_socket.h"

namespace moed::runtime::http {

namespace {

using Clock = std::chrono::steady_clock;

const char* reason(int status) {
  switch (status) {
    case 200: return "OK";
    case 400: return "Bad Request";
    case 404: return "Not Found";
    case 405: return "Method Not Allowed";
    case 408: return "Request Timeout";
    case 413: return "Content Too Large";
    case 431: return "Request Header Fields Too Large";
    case 500: return "Internal Server Error";
    case 501: return "Not Implemented";
    case 503: return "Service Unavailable";
    case 505: return "HTTP Version Not Supported";
    default: return "Status";
  }
}

std::string response(const Answer& a, bool head, bool keep_alive, std::string_view extra_headers = {}) {
  std::string r = fmt::format("HTTP/1.1 {} {}\r\nContent-Type: {}\r\nContent-Length: {}\r\nConnection: {}\r\n{}\r\n",
                              a.status, reason(a.status), a.content_type, a.body.size(),
                              keep_alive ? "keep-alive" : "close", extra_headers);
  if (!head) r += a.body;
  return r;
}

int hex_digit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// %XX decoded (a malformed escape is kept as it is); in a query, '+' is a space.
std::string decode(std::string_view s, bool query) {
  std::string out;
  out.reserve(s.size());
  for (std::size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '%' && i + 2 < s.size() && hex_digit(s[i + 1]) >= 0 && hex_digit(s[i + 2]) >= 0) {
      out += char(hex_digit(s[i + 1]) * 16 + hex_digit(s[i + 2]));
      i += 2;
    } else {
      out += query && s[i] == '+' ? ' ' : s[i];
    }
  }
  return out;
}

Query parse_query(std::string_view text) {
  Query query;
  while (!text.empty()) {
    const std::size_t amp = text.find('&');
    const std::string_view pair = text.substr(0, amp);
    if (!pair.empty()) {
      const std::size_t eq = pair.find('=');
      query.emplace(decode(pair.substr(0, eq), true), eq == std::string_view::npos ? "" : decode(pair.substr(eq + 1), true));
    }
    if (amp == std::string_view::npos) break;
    text.remove_prefix(amp + 1);
  }
  return query;
}

bool same_letters(std::string_view a, std::string_view b) {
  return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin(), [](char x, char y) {
           return std::tolower(static_cast<unsigned char>(x)) == std::tolower(static_cast<unsigned char>(y));
         });
}

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t' || s.back() == '\r')) s.remove_suffix(1);
  return s;
}

// Where the head ends (just past its empty line), once it has all come.
std::optional<std::size_t> head_end(std::string_view in) {
  for (std::size_t at = 0;;) {
    const std::size_t nl = in.find('\n', at);
    if (nl == std::string_view::npos) return std::nullopt;
    if (nl == at || (nl == at + 1 && in[at] == '\r')) return nl + 1;
    at = nl + 1;
  }
}

// A request's head, parsed; status != 0: the answer that refuses it (and
// the connection closes after it).
struct Head {
  int status = 0;
  std::string error;
  std::string method, target;
  bool http10 = false, close = false, keep_alive = false;
  std::size_t body = 0;
};

Head parse_head(std::string_view head, std::size_t max_body) {
  Head h;
  auto refuse = [&](int status, std::string error) {
    h.status = status;
    h.error = std::move(error);
    return h;
  };
  const std::size_t first_nl = head.find('\n');
  const std::string_view line = trim(head.substr(0, first_nl));
  const std::size_t sp1 = line.find(' '), sp2 = line.rfind(' ');
  if (sp1 == std::string_view::npos || sp2 == sp1) return refuse(400, "a request line is METHOD TARGET HTTP/1.1\n");
  h.method = std::string(line.substr(0, sp1));
  h.target = std::string(trim(line.substr(sp1 + 1, sp2 - sp1 - 1)));
  const std::string_view version = line.substr(sp2 + 1);
  if (version == "HTTP/1.0")
    h.http10 = true;
  else if (version != "HTTP/1.1")
    return refuse(505, "HTTP/1.1 or HTTP/1.0 only\n");
  if (h.target.empty() || h.target.front() != '/') return refuse(400, "the target must be a path (/metrics)\n");
  bool has_length = false;
  for (std::size_t at = first_nl + 1; at < head.size();) {
    std::size_t nl = head.find('\n', at);
    if (nl == std::string_view::npos) nl = head.size();
    const std::string_view field = head.substr(at, nl - at);
    at = nl + 1;
    if (trim(field).empty()) break;
    const std::size_t colon = field.find(':');
    if (colon == std::string_view::npos || colon == 0) return refuse(400, "a header line without a name and a colon\n");
    const std::string_view name = field.substr(0, colon), value = trim(field.substr(colon + 1));
    if (same_letters(name, "Content-Length")) {
      std::size_t n = 0;
      const auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), n);
      if (ec != std::errc() || end != value.data() + value.size() || (has_length && n != h.body))
        return refuse(400, "a bad Content-Length\n");
      if (n > max_body) return refuse(413, "a body larger than this server takes (GETs have none)\n");
      h.body = n;
      has_length = true;
    } else if (same_letters(name, "Transfer-Encoding")) {
      return refuse(501, "no Transfer-Encoding is taken (GETs have no body)\n");
    } else if (same_letters(name, "Connection")) {
      // A list of options: close or keep-alive among them.
      for (std::string_view rest = value; !rest.empty();) {
        const std::size_t comma = rest.find(',');
        const std::string_view option = trim(rest.substr(0, comma));
        if (same_letters(option, "close")) h.close = true;
        if (same_letters(option, "keep-alive")) h.keep_alive = true;
        if (comma == std::string_view::npos) break;
        rest.remove_prefix(comma + 1);
      }
    }
  }
  return h;
}

std::string peer_of(const sockaddr_storage& a) {
  char text[INET6_ADDRSTRLEN] = "?";
  if (a.ss_family == AF_INET)
    ::inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in&>(a).sin_addr, text, sizeof text);
  else if (a.ss_family == AF_INET6)
    ::inet_ntop(AF_INET6, &reinterpret_cast<const sockaddr_in6&>(a).sin6_addr, text, sizeof text);
  return text;
}

}  // namespace

struct Server::Impl {
  enum class State { reading, answering, writing };
  struct Connection {
    int fd = -1;
    std::string peer;
    State state = State::reading;
    std::string in, out;
    std::size_t sent = 0;
    Clock::time_point waiting_since, deadline;
    int requests = 0;
    bool keep_alive = true;
    bool peer_done = false;  // the client shut its side: answer what came, then close
  };
  struct Job {
    std::uint64_t serial = 0;
    std::size_t route = 0;
    Query query;
    bool head = false, keep_alive = false;
  };
  struct Done {
    std::uint64_t serial = 0;
    std::string bytes;
    bool keep_alive = false;
  };

  ListenAddress bound;
  Limits limits;
  std::vector<Route> routes;
  std::unordered_map<std::string, std::size_t> route_of;
  std::string index;
  int listen_fd = -1, wake_fd = -1;

  // The I/O thread's own: connections by serial (the order they came).
  std::map<std::uint64_t, Connection> connections;
  std::unordered_map<std::string, std::size_t> per_peer;
  std::uint64_t next_serial = 1;
  Clock::time_point accept_paused_until{};
  ServerCounts tally;  // copied into `shown` after each turn

  std::atomic<bool> stopping{false};
  std::mutex mutex;  // guards jobs, done, workers_stop, shown
  std::condition_variable work;
  std::deque<Job> jobs;
  std::deque<Done> done;
  bool workers_stop = false;
  ServerCounts shown;

  std::thread io;
  std::vector<std::thread> workers;

  void wake() const {
    const std::uint64_t one = 1;
    [[maybe_unused]] const ssize_t n = ::write(wake_fd, &one, sizeof one);
  }

  void loop();
  void accept_all(Clock::time_point now);
  bool evict(const std::string* peer);
  void close_connection(std::uint64_t serial);
  bool drive(std::uint64_t serial, Clock::time_point now);
  bool read_some(Connection& c);
  bool write_some(Connection& c);
  void answer_now(Connection& c, const Answer& a, bool head, bool keep_alive, Clock::time_point now,
                  std::string_view extra_headers = {});
  void take_request(std::uint64_t serial, Connection& c, const Head& h, std::size_t end, Clock::time_point now);
  void work_loop();
};

void Server::Impl::close_connection(std::uint64_t serial) {
  const auto it = connections.find(serial);
  if (it == connections.end()) return;
  // What the client sent and nobody read makes close() reset the connection,
  // which may cost the client the answer just sent (a 408, a 431): read it.
  char buffer[4096];
  for (int i = 0; i < 16 && ::recv(it->second.fd, buffer, sizeof buffer, MSG_DONTWAIT) > 0; ++i) {
  }
  ::close(it->second.fd);
  if (--per_peer[it->second.peer] == 0) per_peer.erase(it->second.peer);
  connections.erase(it);
}

// Closes the connection (of `peer`, or any) that has waited longest for its
// request; false when every such connection is being answered.
bool Server::Impl::evict(const std::string* peer) {
  std::uint64_t oldest = 0;
  Clock::time_point since = Clock::time_point::max();
  for (const auto& [serial, c] : connections)
    if (c.state == State::reading && (!peer || c.peer == *peer) && c.waiting_since < since)
      oldest = serial, since = c.waiting_since;
  if (!oldest) return false;
  close_connection(oldest);
  ++tally.evicted;
  return true;
}

void Server::Impl::accept_all(Clock::time_point now) {
  for (;;) {
    sockaddr_storage address{};
    socklen_t size = sizeof address;
    const int fd = ::accept4(listen_fd, reinterpret_cast<sockaddr*>(&address), &size, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      // Out of descriptors (EMFILE): the listener stays readable, so look
      // again a little later instead of spinning.
      if (errno != EAGAIN && errno != EWOULDBLOCK) accept_paused_until = now + std::chrono::milliseconds(100);
      return;
    }
    std::string peer = peer_of(address);
    const bool room = (per_peer.count(peer) == 0 || per_peer[peer] < limits.per_peer || evict(&peer)) &&
                      (connections.size() < limits.connections || evict(nullptr));
    if (!room) {
      ::close(fd);
      ++tally.refused;
      continue;
    }
    ++per_peer[peer];
    ++tally.accepted;
    Connection& c = connections[next_serial++];
    c.fd = fd;
    c.peer = std::move(peer);
    c.waiting_since = now;
    c.deadline = now + std::chrono::milliseconds(limits.request_ms);
  }
}

// What has come, appended to c.in (c.peer_done at its end); false when the
// connection failed.
bool Server::Impl::read_some(Connection& c) {
  char buffer[8192];
  for (;;) {
    const ssize_t n = ::recv(c.fd, buffer, sizeof buffer, 0);
    if (n > 0) {
      c.in.append(buffer, std::size_t(n));
      // Enough to see a head too long; the rest waits in the socket.
      if (c.in.size() > limits.max_header_bytes + limits.max_body_bytes) return true;
      continue;
    }
    if (n == 0) {
      c.peer_done = true;
      return true;
    }
    if (errno == EINTR) continue;
    return errno == EAGAIN || errno == EWOULDBLOCK;
  }
}

// Sends what the client takes; false when the connection ended.
bool Server::Impl::write_some(Connection& c) {
  while (c.sent < c.out.size()) {
    const ssize_t n = ::send(c.fd, c.out.data() + c.sent, c.out.size() - c.sent, MSG_NOSIGNAL);
    if (n > 0) {
      c.sent += std::size_t(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    return n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK);
  }
  return true;
}

void Server::Impl::answer_now(Connection& c, const Answer& a, bool head, bool keep_alive, Clock::time_point now,
                              std::string_view extra_headers) {
  c.out = response(a, head, keep_alive, extra_headers);
  c.sent = 0;
  c.keep_alive = keep_alive;
  c.state = State::writing;
  c.deadline = now + std::chrono::milliseconds(limits.answer_ms);
}

// A whole request is in c.in, its head h ending at `end`: answer it here,
// or hand it to a worker.
void Server::Impl::take_request(std::uint64_t serial, Connection& c, const Head& h, std::size_t end,
                                Clock::time_point now) {
  c.in.erase(0, end + h.body);
  ++c.requests;
  const bool keep_alive = (h.http10 ? h.keep_alive : !h.close) && !c.peer_done &&
                          c.requests < limits.max_requests_per_connection;
  const bool head = h.method == "HEAD";
  if (!head && h.method != "GET") {
    answer_now(c, {405, "text/plain; charset=utf-8", "GET or HEAD only\n"}, false, keep_alive, now,
               "Allow: GET, HEAD\r\n");
    return;
  }
  const std::size_t question = h.target.find('?');
  const auto route = route_of.find(decode(std::string_view(h.target).substr(0, question), false));
  if (route == route_of.end()) {
    answer_now(c, {404, "text/plain; charset=utf-8", index}, head, keep_alive, now);
    return;
  }
  Job job{serial, route->second, {}, head, keep_alive};
  if (question != std::string::npos) job.query = parse_query(std::string_view(h.target).substr(question + 1));
  c.state = State::answering;
  {
    std::lock_guard lock(mutex);
    jobs.push_back(std::move(job));
  }
  work.notify_one();
}

// Moves the connection on as far as it goes now; false when it was closed.
bool Server::Impl::drive(std::uint64_t serial, Clock::time_point now) {
  Connection& c = connections.at(serial);
  for (;;) {
    if (c.state == State::answering) return true;
    if (c.state == State::writing) {
      if (!write_some(c)) break;
      if (c.sent < c.out.size()) return true;  // the client takes it later
      ++tally.answered;
      if (!c.keep_alive) break;
      c.out.clear();
      c.state = State::reading;
      c.waiting_since = now;
      c.deadline = now + std::chrono::milliseconds(limits.request_ms);
    }
    // Reading: empty lines before a request are ignored. A client that shut
    // its side sends no more: what it sent is answered, the rest dropped.
    const std::size_t start = c.in.find_first_not_of("\r\n");
    c.in.erase(0, std::min(start, c.in.size()));
    if (c.in.empty() && c.peer_done) break;
    if (c.in.empty()) return true;
    const std::optional<std::size_t> end = head_end(c.in);
    if (!end) {
      if (c.peer_done) break;
      if (c.in.size() <= limits.max_header_bytes) return true;
      answer_now(c, {431, "text/plain; charset=utf-8", "the request's head is too long\n"}, false, false, now);
      c.in.clear();
      continue;
    }
    if (*end > limits.max_header_bytes) {
      answer_now(c, {431, "text/plain; charset=utf-8", "the request's head is too long\n"}, false, false, now);
      c.in.clear();
      continue;
    }
    const Head h = parse_head(std::string_view(c.in).substr(0, *end), limits.max_body_bytes);
    if (h.status) {
      answer_now(c, {h.status, "text/plain; charset=utf-8", h.error}, false, false, now);
      c.in.clear();
      continue;
    }
    if (c.in.size() < *end + h.body) {
      if (c.peer_done) break;
      return true;  // the body is coming
    }
    take_request(serial, c, h, *end, now);
  }
  close_connection(serial);
  return false;
}

void Server::Impl::loop() {
  std::vector<pollfd> fds;
  std::vector<std::uint64_t> polled;
  while (!stopping.load()) {
    Clock::time_point now = Clock::now();
    fds.clear();
    polled.clear();
    fds.push_back({wake_fd, POLLIN, 0});
    const bool listening = now >= accept_paused_until;
    fds.push_back({listen_fd, short(listening ? POLLIN : 0), 0});
    Clock::time_point next = listening ? Clock::time_point::max() : accept_paused_until;
    for (const auto& [serial, c] : connections) {
      if (c.state == State::answering) continue;
      fds.push_back({c.fd, short(c.state == State::reading ? POLLIN : POLLOUT), 0});
      polled.push_back(serial);
      next = std::min(next, c.deadline);
    }
    int timeout = -1;
    if (next != Clock::time_point::max())
      timeout = int(std::clamp<long long>(
          std::chrono::ceil<std::chrono::milliseconds>(next - now).count(), 0, 1 << 30));
    const int r = ::poll(fds.data(), nfds_t(fds.size()), timeout);
    if (r < 0 && errno != EINTR) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    now = Clock::now();
    if (r > 0 && fds[0].revents) {
      std::uint64_t count = 0;
      [[maybe_unused]] const ssize_t n = ::read(wake_fd, &count, sizeof count);
      std::deque<Done> answers;
      {
        std::lock_guard lock(mutex);
        answers.swap(done);
      }
      for (Done& d : answers) {
        const auto it = connections.find(d.serial);
        if (it == connections.end()) continue;
        Connection& c = it->second;
        c.out = std::move(d.bytes);
        c.sent = 0;
        c.keep_alive = d.keep_alive;
        c.state = State::writing;
        c.deadline = now + std::chrono::milliseconds(limits.answer_ms);
        drive(d.serial, now);
      }
    }
    if (r > 0 && (fds[1].revents & POLLIN)) accept_all(now);
    for (std::size_t i = 2; r > 0 && i < fds.size(); ++i) {
      if (!fds[i].revents) continue;
      const auto it = connections.find(polled[i - 2]);
      if (it == connections.end()) continue;  // evicted by a newcomer just now
      Connection& c = it->second;
      if (c.state == State::reading && !read_some(c)) {
        close_connection(it->first);
        continue;
      }
      drive(it->first, now);
    }
    // Deadlines: a request not whole in time gets a 408 (when part of it
    // came) and the connection closes; so does an answer not taken in time.
    for (auto it = connections.begin(); it != connections.end();) {
      Connection& c = it->second;
      const std::uint64_t serial = it->first;
      ++it;
      if (c.state == State::answering || c.deadline > now) continue;
      if (c.state == State::reading && !c.in.empty()) {
        c.out = response({408, "text/plain; charset=utf-8", "the request did not come whole in time\n"}, false, false);
        [[maybe_unused]] const ssize_t n = ::send(c.fd, c.out.data(), c.out.size(), MSG_NOSIGNAL);
      }
      ++tally.timed_out;
      close_connection(serial);
    }
    tally.open = connections.size();
    tally.reading = std::size_t(std::count_if(connections.begin(), connections.end(),
                                              [](const auto& e) { return e.second.state == State::reading; }));
    std::lock_guard lock(mutex);
    shown = tally;
  }
  for (auto& [serial, c] : connections) ::close(c.fd);
  connections.clear();
}

void Server::Impl::work_loop() {
  for (;;) {
    Job job;
    {
      std::unique_lock lock(mutex);
      work.wait(lock, [&] { return workers_stop || !jobs.empty(); });
      if (workers_stop) return;
      job = std::move(jobs.front());
      jobs.pop_front();
    }
    Answer a;
    try {
      a = routes[job.route].answer(job.query);
    } catch (const std::exception& e) {
      a = {500, "text/plain; charset=utf-8", std::string("moed: ") + e.what() + "\n"};
    } catch (...) {
      a = {500, "text/plain; charset=utf-8", "moed: the page failed\n"};
    }
    // A route may answer 404 itself (e.g. an untraced request): keep its text.
    if (a.status == 404 && a.body.empty()) a.body = index;
    Done d{job.serial, response(a, job.head, job.keep_alive), job.keep_alive};
    {
      std::lock_guard lock(mutex);
      done.push_back(std::move(d));
    }
    wake();
  }
}

Server::Server(const ListenAddress& address, const std::string& key, std::vector<Route> routes, Limits limits)
    : impl_(std::make_unique<Impl>()) {
  Impl& m = *impl_;
  MOED_CHECK(limits.workers >= 1 && limits.per_peer >= 1 && limits.connections >= 1 && limits.request_ms >= 0 &&
                 limits.answer_ms >= 0,
             "HTTP server limits: at least one worker and one connection, deadlines >= 0");
  m.limits = limits;
  m.index = "moed: no such page. Pages:\n";
  for (const Route& route : routes) m.index += route.path + "  " + route.doc + "\n";
  m.routes = std::move(routes);
  for (std::size_t i = 0; i < m.routes.size(); ++i) m.route_of.emplace(m.routes[i].path, i);
  m.bound = address;
  m.listen_fd = listen_tcp(m.bound, key).release();
  m.wake_fd = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (m.wake_fd < 0) {
    const int error = errno;
    ::close(m.listen_fd);
    MOED_THROW(Runtime, "the HTTP server on {}: eventfd(): {}", m.bound.describe(), std::strerror(error));
  }
  m.io = std::thread([&m] { m.loop(); });
  for (int i = 0; i < limits.workers; ++i) m.workers.emplace_back([&m] { m.work_loop(); });
}

Server::~Server() {
  Impl& m = *impl_;
  m.stopping = true;
  m.wake();
  if (m.io.joinable()) m.io.join();
  {
    std::lock_guard lock(m.mutex);
    m.workers_stop = true;
  }
  m.work.notify_all();
  for (std::thread& t : m.workers) t.join();
  ::close(m.listen_fd);
  ::close(m.wake_fd);
}

const ListenAddress& Server::address() const { return impl_->bound; }

std::string Server::url(const std::string& path) const { return "http://" + impl_->bound.describe() + path; }

ServerCounts Server::counts() const {
  std::lock_guard lock(impl_->mutex);
  return impl_->shown;
}

}  // namespace moed::runtime::http
