#include "client/connection.h"

#include <poll.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

namespace moed::client {

namespace {

std::string errno_text(int err) { return std::strerror(err); }

std::string connect_hint(int err) {
  if (err == ENOENT || err == ECONNREFUSED) return " (is moed running with [workload].kind = \"ingress\"?)";
  if (err == EACCES) return " (the socket is private to the daemon's user)";
  return "";
}

// A daemon's refusal of the whole connection, as an Error to throw.
Error refusal(const std::string& path, const wire::Frame& f) {
  std::string error;
  const auto e = wire::decode_error(f.payload, error);
  if (!e) return Error("moed client: " + error);
  return Error("moed client: the daemon at " + path + " refused: " + e->message, e->status);
}

}  // namespace

Connection::Connection(const std::string& path, const wire::Hello& hello, Deadline deadline) : path_(path) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (path.size() >= sizeof addr.sun_path) throw Error("moed client: socket path too long: " + path);
  std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
  fd_ = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd_ < 0) throw Error("moed client: socket(): " + errno_text(errno));
  try {
    if (::connect(fd_, reinterpret_cast<const sockaddr*>(&addr), sizeof addr) != 0) {
      const int err = errno;
      throw Lost("moed client: cannot connect to " + path + ": " + errno_text(err) + connect_hint(err), err);
    }
    try {
      send(wire::encode(hello));
    } catch (const Lost&) {
      // A daemon that refuses us (uid, too many clients) answers and hangs up
      // at once, maybe before our hello went out: its answer says why.
      const wire::Frame f = next_frame({Clock::now() + std::chrono::milliseconds(200), true});
      if (f.type == wire::Type::error) throw refusal(path, f);
      throw;
    }
    const wire::Frame f = next_frame(deadline);
    if (f.type == wire::Type::error) throw refusal(path, f);
    std::string error;
    auto welcome = f.type == wire::Type::welcome ? wire::decode_welcome(f.payload, error) : std::nullopt;
    if (!welcome) throw Error("moed client: bad welcome from " + path + ": " + error);
    if (memfd_ < 0) throw Error("moed client: the daemon at " + path + " sent no shared memory");
    void* p = ::mmap(nullptr, welcome->layout.region_bytes(), PROT_READ | PROT_WRITE, MAP_SHARED, memfd_, 0);
    if (p == MAP_FAILED) throw Error("moed client: cannot map the shared memory: " + errno_text(errno));
    welcome_ = *welcome;
    region_ = static_cast<std::byte*>(p);
  } catch (...) {
    if (memfd_ >= 0) ::close(memfd_);
    ::close(fd_);
    throw;
  }
}

Connection::~Connection() {
  if (region_) ::munmap(region_, welcome_.layout.region_bytes());
  if (memfd_ >= 0) ::close(memfd_);
  ::close(fd_);
}

void Connection::send(const std::vector<std::byte>& frame) {
  std::size_t off = 0;
  while (off < frame.size()) {
    const ssize_t n = ::send(fd_, frame.data() + off, frame.size() - off, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int err = n < 0 ? errno : EPIPE;
      throw Lost("moed client: lost the connection to " + path_ + ": " + errno_text(err), err);
    }
    off += std::size_t(n);
  }
}

// Reads once (up to the deadline); keeps the first shared-memory fd that
// comes with the bytes.
void Connection::read_some(Deadline deadline) {
  pollfd p{fd_, POLLIN, 0};
  for (;;) {
    int wait_ms = -1;
    if (deadline.set) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline.at - Clock::now()).count();
      wait_ms = int(std::clamp<long long>(left, 0, 1 << 30));  // past the deadline: one last look
    }
    const int r = ::poll(&p, 1, wait_ms);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) throw Error("moed client: poll(): " + errno_text(errno));
    if (r > 0) break;
    if (deadline.set && Clock::now() >= deadline.at)
      throw Error("moed client: timed out waiting for the daemon at " + path_);
  }
  std::byte buffer[8192];
  iovec iov{buffer, sizeof buffer};
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))];
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control;
  msg.msg_controllen = sizeof control;
  ssize_t n;
  do n = ::recvmsg(fd_, &msg, MSG_CMSG_CLOEXEC);
  while (n < 0 && errno == EINTR);
  if (n < 0) throw Lost("moed client: lost the connection to " + path_ + ": " + errno_text(errno), errno);
  if (n == 0) throw Lost("moed client: the daemon at " + path_ + " closed the connection", 0);
  for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c; c = CMSG_NXTHDR(&msg, c))
    if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS) {
      int received;
      std::memcpy(&received, CMSG_DATA(c), sizeof received);
      if (memfd_ < 0)
        memfd_ = received;
      else
        ::close(received);
    }
  reader_.feed({buffer, std::size_t(n)});
}

wire::Frame Connection::next_frame(Deadline deadline) {
  for (;;) {
    std::string error;
    if (auto f = reader_.next(error)) return *f;
    if (!error.empty()) throw Error("moed client: " + path_ + ": " + error);
    read_some(deadline);
  }
}

void Connection::take_address_of(Link& old_link) {
  auto* unix_old = dynamic_cast<Connection*>(&old_link);
  if (!unix_old) return;  // a network link's memory is its own
  Connection& old = *unix_old;
  const std::uint64_t bytes = welcome_.layout.region_bytes();
  if (old.region_ && old.welcome_.layout.region_bytes() == bytes) {
    // MAP_FIXED replaces the old mapping in one step: no moment where the
    // address is unmapped (a stale pointer reads this connection's memory).
    void* p = ::mmap(old.region_, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, memfd_, 0);
    if (p != MAP_FAILED) {
      ::munmap(region_, bytes);
      region_ = static_cast<std::byte*>(p);
      old.region_ = nullptr;
      return;
    }
  }
  if (old.region_) ::munmap(old.region_, old.welcome_.layout.region_bytes());
  old.region_ = nullptr;
}

}  // namespace moed::client
