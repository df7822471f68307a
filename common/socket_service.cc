#include "common/socket_service.h"

#include <spdlog/spdlog.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <exception>

#include "common/error.h"

namespace moed {

namespace {

using Clock = std::chrono::steady_clock;

// After a failed turn, so that a lasting failure does not spin.
constexpr auto kErrorPause = std::chrono::milliseconds(100);
// After accept() failed for want of fds.
constexpr auto kAcceptPause = std::chrono::milliseconds(200);

std::string errno_text(int err) { return std::strerror(err); }

// What the exception being handled says, whatever its type.
std::string current_exception_text() {
  try {
    throw;
  } catch (const std::exception& e) {
    return e.what();
  } catch (...) {
    return "an exception that is not a std::exception";
  }
}

}  // namespace

WakeUp::WakeUp() : fd_(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)) {
  if (!fd_) MOED_THROW(Runtime, "eventfd(): {}", errno_text(errno));
}

void WakeUp::wake() const {
  const std::uint64_t one = 1;
  // Fails only when the counter would overflow, i.e. a wake-up is pending anyway.
  [[maybe_unused]] auto n = ::write(fd_.get(), &one, sizeof one);
}

void WakeUp::clear() const {
  std::uint64_t count;
  [[maybe_unused]] auto n = ::read(fd_.get(), &count, sizeof count);
}

SocketService::SocketService(const std::string& dir, const std::string& path, const SocketNames& names,
                             Handler& handler, int max_clients)
    : names_(names), handler_(handler), max_clients_(max_clients), listener_(dir, path, names) {}

SocketService::~SocketService() {
  stop();
  connections_.clear();
  connections_held_.store(0);
}  // then the listener: closed, and its socket file removed

void SocketService::start() {
  MOED_CHECK(!thread_.joinable() && !stop_.load(), "the {} was started already", names_.what);
  thread_ = std::thread([this] { run(); });
}

void SocketService::stop() {
  stop_.store(true);
  wake();
  if (thread_.joinable()) thread_.join();
}

SocketServiceCounters SocketService::counters() const {
  return {turns_.load(), loop_errors_.load(), connection_errors_.load(), connections_held_.load()};
}

void SocketService::run() {
  while (!stop_.load()) {
    try {
      turn();
    } catch (...) {
      ++loop_errors_;
      spdlog::error("{}: {}", names_.what, current_exception_text());
      std::this_thread::sleep_for(kErrorPause);
    }
  }
}

int SocketService::poll_timeout_ms() {
  std::int64_t wait = std::max(0, handler_.poll_timeout_ms(connections_));
  const auto now = Clock::now();
  if (now < accept_paused_until_)
    wait = std::min<std::int64_t>(
        wait, std::chrono::duration_cast<std::chrono::milliseconds>(accept_paused_until_ - now).count() + 1);
  return static_cast<int>(wait);
}

// One poll and everything that follows from it.
void SocketService::turn() {
  std::vector<pollfd> fds;
  fds.reserve(2 + connections_.size());
  fds.push_back({wake_up_->fd(), POLLIN, 0});
  // While accept() fails for lack of fds, the listener stays readable: leave
  // it out of the poll for a moment rather than spin.
  const bool accepting = Clock::now() >= accept_paused_until_;
  fds.push_back({listener_.fd(), static_cast<short>(accepting ? POLLIN : 0), 0});
  for (const auto& c : connections_) fds.push_back({c->fd(), handler_.events(*c), 0});
  if (::poll(fds.data(), fds.size(), poll_timeout_ms()) < 0) {
    if (errno == EINTR) return;
    MOED_THROW(Runtime, "poll() over {} fds: {}", fds.size(), errno_text(errno));
  }
  ++turns_;
  if (stop_.load()) return;

  if (fds[0].revents & POLLIN) {
    wake_up_->clear();  // before woken() looks: a later wake() polls again
    handler_.woken(connections_);
  }
  // connections_[i] was polled as fds[2 + i]: every one is served before any leaves.
  SocketConnections leaving;
  for (std::size_t i = 0; i < connections_.size(); ++i)
    if (!serve(*connections_[i], fds[2 + i].revents)) leaving.push_back(connections_[i]);
  for (const auto& c : leaving) close(c);
  if (fds[1].revents & POLLIN) accept_all();
}

bool SocketService::serve(SocketConnection& c, short revents) {
  try {
    return handler_.serve(c, revents);
  } catch (...) {
    ++connection_errors_;
    spdlog::error("{}: connection {} (pid {}) failed, closing it: {}", names_.what, c.serial(), c.peer().pid,
                  current_exception_text());
    return false;
  }
}

void SocketService::close(const std::shared_ptr<SocketConnection>& c) {
  std::erase(connections_, c);
  connections_held_.store(connections_.size());
  try {
    handler_.closed(*c);
  } catch (...) {
    ++connection_errors_;
    spdlog::error("{}: closing connection {} (pid {}) failed: {}", names_.what, c->serial(), c->peer().pid,
                  current_exception_text());
  }
}

void SocketService::accept_all() {
  for (;;) {
    int error = 0;
    UniqueFd fd = listener_.accept(error);
    if (!fd) {
      if (error == 0) return;
      // EMFILE and the like: leave the rest in the backlog for a later turn.
      spdlog::warn("{}: accept(): {}", names_.what, errno_text(error));
      accept_paused_until_ = Clock::now() + kAcceptPause;
      return;
    }
    admit(std::move(fd));
  }
}

void SocketService::admit(UniqueFd fd) {
  PeerCredentials peer;
  try {
    peer = peer_credentials(fd.get());
  } catch (const Error& e) {
    spdlog::warn("{}: {}", names_.what, e.what());
    return;
  }
  try {
    if (!peer_may_connect(peer.uid)) {
      spdlog::warn("{} {}: refused a connection from uid {} (pid {}): only uid {} or root", names_.what, path(),
                   peer.uid, peer.pid, ::geteuid());
      handler_.refuse(fd.get(), Refusal::forbidden, peer);
      return;
    }
    if (static_cast<int>(connections_.size()) >= max_clients_) {
      SocketConnection* victim = handler_.evictee(connections_);
      if (!victim) {
        handler_.refuse(fd.get(), Refusal::full, peer);
        return;
      }
      auto it = std::find_if(connections_.begin(), connections_.end(),
                             [&](const auto& c) { return c.get() == victim; });
      MOED_CHECK(it != connections_.end(), "the connection to evict is not one of the {}", names_.what);
      close(std::shared_ptr<SocketConnection>(*it));
    }
    std::shared_ptr<SocketConnection> c = handler_.admit(std::move(fd), next_serial_++, peer);
    MOED_CHECK(c != nullptr, "the {} admitted a connection as nothing", names_.what);
    connections_.push_back(std::move(c));
    connections_held_.store(connections_.size());
  } catch (...) {
    ++connection_errors_;
    spdlog::error("{}: admitting a connection (pid {}) failed: {}", names_.what, peer.pid, current_exception_text());
  }
}

}  // namespace moed
