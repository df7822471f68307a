#include "runtime/observe/http/http_server.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <thread>

#include <httplib.h>

#include "common/error.h"

namespace moed::runtime::http {

namespace {

// A kept-alive connection holds its thread until it closes or idles out
// (the read timeout), and a browser opens up to 6 per host: with fewer
// threads, the dashboard's polls queue behind its own idle connections.
// 8 threads serve a browser and a scraper at once; they idle otherwise.
constexpr std::size_t kThreads = 8;

// Why `address` cannot be bound, from a plain bind of our own (cpp-httplib
// only says that it failed).
std::string bind_error(const ListenAddress& address) {
  const bool v6 = address.host.find(':') != std::string::npos;
  const int fd = ::socket(v6 ? AF_INET6 : AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return std::strerror(errno);
  int yes = 1;
  ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes);
  int rc;
  if (v6) {
    sockaddr_in6 a{};
    a.sin6_family = AF_INET6;
    a.sin6_port = htons(std::uint16_t(address.port));
    ::inet_pton(AF_INET6, address.host.c_str(), &a.sin6_addr);
    rc = ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a);
  } else {
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(std::uint16_t(address.port));
    ::inet_pton(AF_INET, address.host.c_str(), &a.sin_addr);
    rc = ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a);
  }
  const int error = errno;
  ::close(fd);
  if (rc == 0) return "the bind failed, then succeeded when tried again";
  if (error == EADDRINUSE) return "the port is in use (another moed, or another program: `ss -ltnp` names it)";
  if (error == EADDRNOTAVAIL) return "not an address of this host";
  return std::strerror(error);
}

}  // namespace

struct Server::Impl {
  httplib::Server server;
  ListenAddress bound;
  std::thread thread;
};

Server::Server(const ListenAddress& address, const std::string& key, std::vector<Route> routes)
    : impl_(std::make_unique<Impl>()) {
  httplib::Server& s = impl_->server;
  s.new_task_queue = [] { return new httplib::ThreadPool(kThreads); };
  // SO_REUSEADDR only: cpp-httplib's default adds SO_REUSEPORT, which would
  // let a second daemon share the port instead of failing.
  s.set_socket_options([](socket_t fd) {
    int yes = 1;
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes);
  });
  s.set_keep_alive_max_count(100);
  s.set_read_timeout(5, 0);
  s.set_write_timeout(5, 0);
  std::string index = "moed: no such page. Pages:\n";
  for (const Route& route : routes) index += route.path + "  " + route.doc + "\n";
  for (Route& route : routes)
    s.Get(route.path, [answer = std::move(route.answer)](const httplib::Request& request, httplib::Response& response) {
      Answer a = answer(request.params);
      response.status = a.status;
      response.set_content(std::move(a.body), a.content_type.c_str());
    });
  s.set_error_handler([index](const httplib::Request&, httplib::Response& response) {
    // A route may answer 404 itself (e.g. an untraced request): keep its text.
    if (response.status == 404 && response.body.empty()) response.set_content(index, "text/plain; charset=utf-8");
  });
  impl_->bound = address;
  const bool bound = address.port == 0 ? (impl_->bound.port = s.bind_to_any_port(address.host)) > 0
                                       : s.bind_to_port(address.host, address.port);
  if (!bound) MOED_THROW(Usage, "{} = \"{}\": cannot listen: {}", key, address.describe(), bind_error(address));
  impl_->thread = std::thread([&s] { s.listen_after_bind(); });
  // stop() before the loop runs would be lost and the join would hang: wait
  // for it (it starts at once; the bound is only against a stuck thread).
  for (int i = 0; i < 5000 && !s.is_running(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  MOED_CHECK(s.is_running(), "the HTTP server on {} did not start within 5 s", impl_->bound.describe());
}

Server::~Server() {
  impl_->server.stop();
  if (impl_->thread.joinable()) impl_->thread.join();
}

const ListenAddress& Server::address() const { return impl_->bound; }

std::string Server::url(const std::string& path) const { return "http://" + impl_->bound.describe() + path; }

}  // namespace moed::runtime::http
