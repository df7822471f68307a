#include "common/tcp_socket.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>

#include <cerrno>
#include <cstring>

#include "common/error.h"

namespace moed {

namespace {

struct SocketAddress {
  sockaddr_storage storage{};
  socklen_t length = 0;
  bool v6 = false;
};

SocketAddress socket_address(const ListenAddress& address, const std::string& key) {
  SocketAddress out;
  out.v6 = address.host.find(':') != std::string::npos;
  int parsed = 0;
  const std::string host = address.host == "localhost" ? "127.0.0.1" : address.host;
  if (out.v6) {
    auto& a = reinterpret_cast<sockaddr_in6&>(out.storage);
    a.sin6_family = AF_INET6;
    a.sin6_port = htons(std::uint16_t(address.port));
    parsed = ::inet_pton(AF_INET6, host.c_str(), &a.sin6_addr);
    out.length = sizeof a;
  } else {
    auto& a = reinterpret_cast<sockaddr_in&>(out.storage);
    a.sin_family = AF_INET;
    a.sin_port = htons(std::uint16_t(address.port));
    parsed = ::inet_pton(AF_INET, host.c_str(), &a.sin_addr);
    out.length = sizeof a;
  }
  if (parsed != 1) MOED_THROW(Usage, "{} = \"{}\": not a numeric address", key, address.describe());
  return out;
}

int milliseconds_left(TcpClock::time_point deadline) {
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - TcpClock::now()).count();
  return left <= 0 ? 0 : int(std::min<long long>(left, 1 << 30));
}

// Waits until `fd` is ready for `events`; false once the deadline passed.
bool wait_ready(int fd, short events, TcpClock::time_point deadline) {
  for (;;) {
    pollfd p{fd, events, 0};
    const int n = ::poll(&p, 1, milliseconds_left(deadline));
    if (n > 0) return true;
    if (n == 0) return false;
    if (errno != EINTR) return false;
  }
}

}  // namespace

UniqueFd listen_tcp(ListenAddress& address, const std::string& key) {
  SocketAddress a = socket_address(address, key);
  UniqueFd fd(::socket(a.v6 ? AF_INET6 : AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  if (!fd) MOED_THROW(Runtime, "{} = \"{}\": socket(): {}", key, address.describe(), std::strerror(errno));
  // SO_REUSEADDR only (a port in TIME_WAIT): never SO_REUSEPORT, which
  // would let a second daemon share the port instead of failing.
  int yes = 1;
  ::setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes);
  if (::bind(fd.get(), reinterpret_cast<sockaddr*>(&a.storage), a.length) != 0 || ::listen(fd.get(), 128) != 0) {
    const int error = errno;
    const std::string why = error == EADDRINUSE      ? "the port is in use (another moed, or another program: `ss -ltnp` names it)"
                            : error == EADDRNOTAVAIL ? "not an address of this host"
                                                     : std::strerror(error);
    MOED_THROW(Usage, "{} = \"{}\": cannot listen: {}", key, address.describe(), why);
  }
  if (address.port == 0) {
    sockaddr_storage bound{};
    socklen_t size = sizeof bound;
    ::getsockname(fd.get(), reinterpret_cast<sockaddr*>(&bound), &size);
    address.port = ntohs(bound.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6&>(bound).sin6_port
                                                      : reinterpret_cast<sockaddr_in&>(bound).sin_port);
  }
  return fd;
}

UniqueFd connect_tcp(const ListenAddress& address, TcpClock::time_point deadline, const std::string& what) {
  SocketAddress a = socket_address(address, what);
  UniqueFd fd(::socket(a.v6 ? AF_INET6 : AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  if (!fd) MOED_THROW(Runtime, "{}: socket(): {}", what, std::strerror(errno));
  int error = 0;
  if (::connect(fd.get(), reinterpret_cast<sockaddr*>(&a.storage), a.length) != 0) {
    error = errno;
    if (error == EINPROGRESS) {
      if (!wait_ready(fd.get(), POLLOUT, deadline))
        MOED_THROW(Runtime, "{}: connecting to {} timed out", what, address.describe());
      socklen_t size = sizeof error;
      ::getsockopt(fd.get(), SOL_SOCKET, SO_ERROR, &error, &size);
    }
  }
  if (error != 0)
    MOED_THROW(Runtime, "{}: cannot connect to {}: {}", what, address.describe(), std::strerror(error));
  int yes = 1;
  ::setsockopt(fd.get(), IPPROTO_TCP, TCP_NODELAY, &yes, sizeof yes);
  return fd;
}

namespace {

void write_all(int fd, const char* data, std::size_t bytes, TcpClock::time_point deadline, const std::string& what) {
  while (bytes > 0) {
    const ssize_t n = ::send(fd, data, bytes, MSG_NOSIGNAL);
    if (n > 0) {
      data += n, bytes -= std::size_t(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      if (!wait_ready(fd, POLLOUT, deadline)) MOED_THROW(Runtime, "{}: the peer took nothing before the deadline", what);
      continue;
    }
    MOED_THROW(Runtime, "{}: send: {}", what, std::strerror(errno));
  }
}

void read_all(int fd, char* data, std::size_t bytes, TcpClock::time_point deadline, const std::string& what) {
  while (bytes > 0) {
    const ssize_t n = ::recv(fd, data, bytes, 0);
    if (n > 0) {
      data += n, bytes -= std::size_t(n);
      continue;
    }
    if (n == 0) MOED_THROW(Runtime, "{}: the peer closed the connection", what);
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) {
      if (!wait_ready(fd, POLLIN, deadline)) MOED_THROW(Runtime, "{}: nothing came before the deadline", what);
      continue;
    }
    MOED_THROW(Runtime, "{}: recv: {}", what, std::strerror(errno));
  }
}

}  // namespace

void write_frame(int fd, std::string_view payload, TcpClock::time_point deadline, const std::string& what) {
  MOED_CHECK(payload.size() <= 0xffffffffu, "{}: a frame of {} bytes", what, payload.size());
  const std::uint32_t n = std::uint32_t(payload.size());
  const char length[4] = {char(n & 0xff), char((n >> 8) & 0xff), char((n >> 16) & 0xff), char(n >> 24)};
  write_all(fd, length, sizeof length, deadline, what);
  write_all(fd, payload.data(), payload.size(), deadline, what);
}

std::string read_frame(int fd, std::size_t max_bytes, TcpClock::time_point deadline, const std::string& what) {
  unsigned char length[4];
  read_all(fd, reinterpret_cast<char*>(length), sizeof length, deadline, what);
  const std::size_t n = std::size_t(length[0]) | std::size_t(length[1]) << 8 | std::size_t(length[2]) << 16 |
                        std::size_t(length[3]) << 24;
  if (n > max_bytes) MOED_THROW(Runtime, "{}: a frame of {} bytes announced, at most {} taken", what, n, max_bytes);
  std::string payload(n, '\0');
  read_all(fd, payload.data(), n, deadline, what);
  return payload;
}

}  // namespace moed
