// The HTTP endpoint's server over real sockets: routes, HEAD, refusals,
// keep-alive and pipelining; and what slow or greedy clients cannot do:
// connections that trickle a request a byte at a time do not starve a
// scraper, a request's deadline closes them, each peer holds a bounded
// number of connections. Every wait is for a state (the server's counts, an
// answer); times are only bounds for failure.
#include "runtime/observe/http/http_server.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <future>
#include <string>
#include <thread>
#include <vector>

#include "tests/unit/test_support.h"

namespace moed::runtime::http {
namespace {

using namespace std::chrono_literals;
using moed::test::wait_until;

// A blocking client socket to 127.0.0.1:port (from `from`, a loopback
// address, when given); reads give up after `bound` (a failure bound only).
int connect_to(int port, const char* from = nullptr, std::chrono::seconds bound = 30s) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  EXPECT_GE(fd, 0);
  timeval tv{static_cast<time_t>(bound.count()), 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  if (from) {
    sockaddr_in local{};
    local.sin_family = AF_INET;
    ::inet_pton(AF_INET, from, &local.sin_addr);
    EXPECT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&local), sizeof local), 0) << std::strerror(errno);
  }
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(std::uint16_t(port));
  ::inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
  EXPECT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0) << std::strerror(errno);
  return fd;
}

void send_all(int fd, std::string_view text) {
  while (!text.empty()) {
    const ssize_t n = ::send(fd, text.data(), text.size(), MSG_NOSIGNAL);
    ASSERT_GT(n, 0) << std::strerror(errno);
    text.remove_prefix(std::size_t(n));
  }
}

struct Reply {
  int status = 0;     // 0: the connection ended (or the read bound passed) before a whole answer
  std::string head;   // status line and headers
  std::string body;
};

// Reads one answer (`rest` keeps what came after it, for pipelining).
Reply read_reply(int fd, std::string& rest, bool head_only = false) {
  Reply r;
  std::string& in = rest;
  char buffer[4096];
  std::size_t end;
  while ((end = in.find("\r\n\r\n")) == std::string::npos) {
    const ssize_t n = ::recv(fd, buffer, sizeof buffer, 0);
    if (n <= 0) return r;
    in.append(buffer, std::size_t(n));
  }
  r.head = in.substr(0, end + 2);
  const std::size_t at = r.head.find("Content-Length: ");
  const std::size_t length = at == std::string::npos ? 0 : std::stoul(r.head.substr(at + 16));
  const std::size_t body = head_only ? 0 : length;
  while (in.size() < end + 4 + body) {
    const ssize_t n = ::recv(fd, buffer, sizeof buffer, 0);
    if (n <= 0) return r;
    in.append(buffer, std::size_t(n));
  }
  r.body = in.substr(end + 4, body);
  in.erase(0, end + 4 + body);
  r.status = std::stoi(r.head.substr(9, 3));
  return r;
}

Reply ask(int port, std::string_view request, bool head_only = false) {
  const int fd = connect_to(port);
  send_all(fd, request);
  std::string rest;
  Reply r = read_reply(fd, rest, head_only);
  ::close(fd);
  return r;
}

// True once the peer has closed the connection (a read gives 0).
bool closed_by_server(int fd) {
  char buffer[512];
  for (;;) {
    const ssize_t n = ::recv(fd, buffer, sizeof buffer, 0);
    if (n == 0) return true;
    if (n < 0) return errno == ECONNRESET;
  }
}

// A new connection sends `request`, gets a 200, then the server closes it
// (the request said so, or its deadline for the next request passed).
void answered_then_closed(int port, std::string_view request) {
  const int fd = connect_to(port);
  send_all(fd, request);
  std::string rest;
  EXPECT_EQ(read_reply(fd, rest).status, 200);
  EXPECT_TRUE(closed_by_server(fd));
  ::close(fd);
}

std::vector<Route> test_routes() {
  return {{"/metrics", "the figures", [](const Query&) { return Answer{200, "text/plain; version=0.0.4", "up 1\n"}; }},
          {"/echo", "the query, one name=value a line",
           [](const Query& q) {
             std::string body;
             for (const auto& [k, v] : q) body += k + "=" + v + "\n";
             return Answer{200, "text/plain; charset=utf-8", body};
           }},
          {"/untraced", "a route's own 404", [](const Query&) { return Answer{404, "text/plain", "not traced\n"}; }},
          {"/throws", "a route that fails", [](const Query&) -> Answer { throw std::runtime_error("broken"); }}};
}

Server start(Limits limits = {}, std::vector<Route> routes = test_routes()) {
  return Server(parse_listen_address("127.0.0.1:0", "[metrics].listen"), "[metrics].listen", std::move(routes),
                limits);
}

TEST(HttpServer, AnswersItsRoutes) {
  Server s(parse_listen_address("127.0.0.1:0", "[metrics].listen"), "[metrics].listen", test_routes());
  const int port = s.address().port;
  ASSERT_GT(port, 0);
  EXPECT_EQ(s.url("/metrics"), "http://127.0.0.1:" + std::to_string(port) + "/metrics");
  Reply r = ask(port, "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n");
  EXPECT_EQ(r.status, 200);
  EXPECT_EQ(r.body, "up 1\n");
  EXPECT_NE(r.head.find("Content-Type: text/plain; version=0.0.4\r\n"), std::string::npos) << r.head;
  // HEAD: the same head, no body.
  r = ask(port, "HEAD /metrics HTTP/1.1\r\n\r\n", true);
  EXPECT_EQ(r.status, 200);
  EXPECT_NE(r.head.find("Content-Length: 5\r\n"), std::string::npos) << r.head;
  // The query decoded: %XX, '+' as a space, a name given twice, a name alone.
  r = ask(port, "GET /echo?layer=1&layer=2&q=a%2Fb+c&flag HTTP/1.1\r\n\r\n");
  EXPECT_EQ(r.body, "flag=\nlayer=1\nlayer=2\nq=a/b c\n");
  // An unknown page lists the pages; a route's own 404 keeps its text; a
  // route that throws is a 500 naming the failure.
  r = ask(port, "GET /nope HTTP/1.1\r\n\r\n");
  EXPECT_EQ(r.status, 404);
  EXPECT_NE(r.body.find("/metrics  the figures"), std::string::npos) << r.body;
  r = ask(port, "GET /untraced HTTP/1.1\r\n\r\n");
  EXPECT_EQ(r.status, 404);
  EXPECT_EQ(r.body, "not traced\n");
  r = ask(port, "GET /throws HTTP/1.1\r\n\r\n");
  EXPECT_EQ(r.status, 500);
  EXPECT_NE(r.body.find("broken"), std::string::npos);
}

TEST(HttpServer, RefusesWhatItDoesNotServe) {
  Server s = start();
  const int port = s.address().port;
  Reply r = ask(port, "POST /metrics HTTP/1.1\r\nContent-Length: 3\r\n\r\nabc");
  EXPECT_EQ(r.status, 405);
  EXPECT_NE(r.head.find("Allow: GET, HEAD"), std::string::npos);
  EXPECT_EQ(ask(port, "GET /metrics HTTP/2.0\r\n\r\n").status, 505);
  EXPECT_EQ(ask(port, "nonsense\r\n\r\n").status, 400);
  EXPECT_EQ(ask(port, "GET metrics HTTP/1.1\r\n\r\n").status, 400);
  EXPECT_EQ(ask(port, "GET /metrics HTTP/1.1\r\nContent-Length: x\r\n\r\n").status, 400);
  EXPECT_EQ(ask(port, "GET /metrics HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n").status, 501);
  EXPECT_EQ(ask(port, "GET /metrics HTTP/1.1\r\nContent-Length: 99999999\r\n\r\n").status, 413);
  EXPECT_EQ(ask(port, "GET /metrics HTTP/1.1\r\nX-Big: " + std::string(20000, 'a') + "\r\n\r\n").status, 431);
  // Still serving.
  EXPECT_EQ(ask(port, "GET /metrics HTTP/1.1\r\n\r\n").status, 200);
}

TEST(HttpServer, KeepsConnectionsAliveAndAnswersPipelinedRequestsInOrder) {
  Server s = start();
  const int fd = connect_to(s.address().port);
  send_all(fd, "GET /echo?n=1 HTTP/1.1\r\n\r\nGET /echo?n=2 HTTP/1.1\r\n\r\n");
  std::string rest;
  EXPECT_EQ(read_reply(fd, rest).body, "n=1\n");
  EXPECT_EQ(read_reply(fd, rest).body, "n=2\n");
  send_all(fd, "GET /echo?n=3 HTTP/1.1\r\nConnection: close\r\n\r\n");
  const Reply last = read_reply(fd, rest);
  EXPECT_EQ(last.body, "n=3\n");
  EXPECT_NE(last.head.find("Connection: close"), std::string::npos);
  EXPECT_TRUE(closed_by_server(fd));
  ::close(fd);
  // HTTP/1.0 closes unless asked to keep alive.
  answered_then_closed(s.address().port, "GET /metrics HTTP/1.0\r\n\r\n");
  // A client that shuts its side after its request is answered, then closed.
  const int half = connect_to(s.address().port);
  send_all(half, "GET /metrics HTTP/1.1\r\n\r\n");
  ::shutdown(half, SHUT_WR);
  EXPECT_EQ(read_reply(half, rest).status, 200);
  EXPECT_TRUE(closed_by_server(half));
  ::close(half);
}

// The defect of issue 33: 8 connections trickling a request a byte at a time
// took the 8 threads of the server, and /metrics stopped answering while they
// lasted. Here 12 trickle for as long as the test runs (their deadline is a
// minute away), and a scraper from the same address is answered meanwhile.
TEST(HttpServer, ConnectionsThatTrickleDoNotStarveAScraper) {
  Limits limits;
  limits.request_ms = 60'000;
  Server s = start(limits);
  const int port = s.address().port;
  constexpr int kSlow = 12;
  std::vector<int> slow;
  for (int i = 0; i < kSlow; ++i) slow.push_back(connect_to(port));
  const std::string request = "GET /metrics HTTP/1.1\r\nX-Slow: " + std::string(4000, 'a');  // never whole
  std::atomic<bool> stop{false};
  std::atomic<int> sent{0};
  std::thread trickle([&] {
    for (std::size_t at = 0; at < request.size() && !stop; ++at) {
      for (const int fd : slow) ::send(fd, &request[at], 1, MSG_NOSIGNAL);
      sent = int(at + 1);
      std::this_thread::sleep_for(20ms);
    }
  });
  ASSERT_TRUE(wait_until([&] { return s.counts().reading == kSlow && sent >= 3; }, "12 slow connections reading"));
  const auto asked = std::chrono::steady_clock::now();
  const Reply r = ask(port, "GET /metrics HTTP/1.1\r\n\r\n");
  const auto waited = std::chrono::steady_clock::now() - asked;
  // The trickle went on all along: the slow connections are still there.
  const ServerCounts during = s.counts();
  stop = true;
  trickle.join();
  EXPECT_EQ(r.status, 200) << "no answer within the 30 s bound while 12 connections trickle";
  EXPECT_EQ(r.body, "up 1\n");
  EXPECT_GE(during.reading, std::size_t(kSlow));
  EXPECT_EQ(during.evicted + during.timed_out, 0u);
  std::cout << "answered in " << std::chrono::duration<double, std::milli>(waited).count() << " ms beside " << kSlow
            << " trickling connections\n";
  for (const int fd : slow) ::close(fd);
}

TEST(HttpServer, ARequestNotWholeByItsDeadlineGets408AndTheConnectionCloses) {
  Limits limits;
  limits.request_ms = 300;
  Server s = start(limits);
  const int fd = connect_to(s.address().port);
  const auto opened = std::chrono::steady_clock::now();
  std::atomic<bool> stop{false};
  std::thread trickle([&] {
    const std::string request = "GET /metrics HTTP/1.1\r\nX-Slow: " + std::string(100000, 'a');
    for (std::size_t at = 0; at < request.size() && !stop; ++at) {
      if (::send(fd, &request[at], 1, MSG_NOSIGNAL) != 1) return;  // closed by the server
      std::this_thread::sleep_for(10ms);
    }
  });
  std::string rest;
  const Reply r = read_reply(fd, rest);
  const auto lasted = std::chrono::steady_clock::now() - opened;
  EXPECT_EQ(r.status, 408);
  EXPECT_TRUE(closed_by_server(fd));
  stop = true;
  trickle.join();
  ::close(fd);
  EXPECT_GE(lasted, 300ms) << "closed before its deadline";
  // An idle connection is closed at the same deadline, without an answer.
  const int idle = connect_to(s.address().port);
  EXPECT_TRUE(closed_by_server(idle));
  ::close(idle);
  EXPECT_TRUE(wait_until([&] { return s.counts().timed_out == 2 && s.counts().open == 0; }, "both timed out"));
  // A kept-alive connection's next request has its own deadline.
  answered_then_closed(s.address().port, "GET /metrics HTTP/1.1\r\n\r\n");
}

TEST(HttpServer, BoundsTheConnectionsOfAPeer) {
  Limits limits;
  limits.request_ms = 60'000;
  limits.per_peer = 4;
  // Answers held until released, to keep connections in their answering state.
  std::promise<void> release;
  std::shared_future<void> released = release.get_future().share();
  std::vector<Route> routes = test_routes();
  routes.push_back({"/held", "answers once released", [released](const Query&) {
                      released.wait();
                      return Answer{200, "text/plain", "held\n"};
                    }});
  Server s = start(limits, std::move(routes));
  const int port = s.address().port;
  std::vector<int> idle;
  for (int i = 0; i < 4; ++i) {
    idle.push_back(connect_to(port));
    ASSERT_TRUE(wait_until([&] { return s.counts().open == std::size_t(i + 1); }, "a connection accepted"));
  }
  // A fifth from the same address closes the one that has waited longest.
  const int fifth = connect_to(port);
  ASSERT_TRUE(wait_until([&] { return s.counts().evicted == 1; }, "the oldest connection evicted"));
  EXPECT_TRUE(closed_by_server(idle[0]));
  EXPECT_EQ(s.counts().open, 4u);
  std::string rest;
  send_all(fifth, "GET /metrics HTTP/1.1\r\n\r\n");
  EXPECT_EQ(read_reply(fifth, rest).status, 200);
  // Another address is not counted against this one.
  const int other = connect_to(port, "127.0.0.2");
  ASSERT_TRUE(wait_until([&] { return s.counts().open == 5; }, "the other peer's connection accepted"));
  EXPECT_EQ(s.counts().evicted, 1u);
  // When every connection of the peer is being answered, a newcomer is refused.
  for (int i = 1; i < 4; ++i) send_all(idle[std::size_t(i)], "GET /held HTTP/1.1\r\n\r\n");
  send_all(fifth, "GET /held HTTP/1.1\r\n\r\n");
  ASSERT_TRUE(wait_until([&] { return s.counts().reading == 1; }, "4 answering, the other peer reading"));
  const int refused = connect_to(port);
  EXPECT_TRUE(closed_by_server(refused));
  EXPECT_TRUE(wait_until([&] { return s.counts().refused == 1; }, "the newcomer counted as refused"));
  EXPECT_EQ(s.counts().evicted, 1u);
  release.set_value();
  for (const int fd : {idle[1], idle[2], idle[3], fifth}) {
    std::string more;
    EXPECT_EQ(read_reply(fd, more).body, "held\n");
  }
  for (const int fd : idle) ::close(fd);
  for (const int fd : {fifth, other, refused}) ::close(fd);
}

TEST(HttpServer, APortInUseIsRefusedNamingTheKey) {
  Server s = start();
  const std::string taken = "127.0.0.1:" + std::to_string(s.address().port);
  moed::test::expect_error(
      [&] { Server(parse_listen_address(taken, "[metrics].listen"), "[metrics].listen", test_routes()); },
      ErrorKind::Usage, {"[metrics].listen = \"" + taken + "\": cannot listen: the port is in use"});
}

}  // namespace
}  // namespace moed::runtime::http
