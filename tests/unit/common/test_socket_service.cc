// The socket service skeleton, for real: a service in a TempDir with an echo
// handler that can be told to evict, to throw and to refuse, and clients on
// raw sockets. Every wait is for a state the handler or the service reports.
#include "common/socket_service.h"

#include <gtest/gtest.h>
#include <poll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <future>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "tests/unit/test_support.h"

namespace moed {
namespace {

using namespace std::chrono_literals;

// Thrown by the handler: not a std::exception.
struct Oddity {};

// Echoes what each connection sends; "bye" closes it, "throw" throws an
// Oddity. Refusals and evictions are one line ("full", "forbidden",
// "evicted"). Everything it sees is counted under a mutex, for the test to
// wait on.
class EchoHandler : public SocketService::Handler {
 public:
  void refuse(int fd, Refusal why, const PeerCredentials&) override {
    say(fd, why == Refusal::full ? "full\n" : "forbidden\n");
    change([&] { ++refused; });
  }
  SocketConnection* evictee(const SocketConnections& all) override {
    if (!evict || all.empty()) return nullptr;
    say(all.front()->fd(), "evicted\n");
    return all.front().get();
  }
  std::shared_ptr<SocketConnection> admit(UniqueFd fd, std::uint64_t serial, const PeerCredentials& peer) override {
    if (throw_on_admit) throw Oddity{};
    change([&] {
      serials.push_back(serial);
      peers.push_back(peer);
    });
    return std::make_shared<SocketConnection>(std::move(fd), serial, peer);
  }
  bool serve(SocketConnection& c, short revents) override {
    if (!(revents & (POLLIN | POLLHUP | POLLERR))) return true;
    char buffer[256];
    const ssize_t n = ::recv(c.fd(), buffer, sizeof buffer, MSG_DONTWAIT);
    if (n < 0) return errno == EAGAIN || errno == EINTR;
    const std::string got(buffer, static_cast<std::size_t>(n));
    if (n == 0 || got == "bye\n") return false;
    if (got == "throw\n") throw Oddity{};
    say(c.fd(), got);
    return true;
  }
  void closed(SocketConnection&) override { change([&] { ++closes; }); }
  // Only a wake-up or a connection ends a poll early.
  int poll_timeout_ms(const SocketConnections&) override { return 60'000; }
  void woken(const SocketConnections&) override { change([&] { ++wakes; }); }

  // Waits up to 10 s for `state` to hold; false if it never did.
  template <class State>
  bool wait_until(State state) {
    std::unique_lock lock(mutex_);
    return changed_.wait_for(lock, 10s, state);
  }

  std::atomic<bool> evict{false}, throw_on_admit{false};
  // Guarded by the mutex (wait_until holds it while it looks).
  std::vector<std::uint64_t> serials;
  std::vector<PeerCredentials> peers;
  int refused = 0, closes = 0, wakes = 0;

 private:
  static void say(int fd, const std::string& line) {
    [[maybe_unused]] auto n = ::send(fd, line.data(), line.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
  }
  template <class Change>
  void change(Change f) {
    {
      std::lock_guard lock(mutex_);
      f();
    }
    changed_.notify_all();
  }
  std::mutex mutex_;
  std::condition_variable changed_;
};

// A blocking client: a line out, a line back (nullopt on end of stream).
class LineClient {
 public:
  explicit LineClient(const std::string& path) : fd_(connect_unix_socket(path)) {}
  void send(const std::string& line) {
    const std::string data = line + "\n";
    ASSERT_EQ(::send(fd_.get(), data.data(), data.size(), MSG_NOSIGNAL), static_cast<ssize_t>(data.size()));
  }
  // The next line, or nullopt at the end of the stream (or after 10 s).
  std::optional<std::string> read_line() {
    for (;;) {
      if (auto nl = buffer_.find('\n'); nl != std::string::npos) {
        std::string line = buffer_.substr(0, nl);
        buffer_.erase(0, nl + 1);
        return line;
      }
      pollfd p{fd_.get(), POLLIN, 0};
      if (::poll(&p, 1, 10'000) <= 0) return std::nullopt;
      char chunk[256];
      const ssize_t n = ::recv(fd_.get(), chunk, sizeof chunk, 0);
      if (n <= 0) return std::nullopt;
      buffer_.append(chunk, static_cast<std::size_t>(n));
    }
  }
  std::optional<std::string> call(const std::string& line) {
    send(line);
    return read_line();
  }

 private:
  UniqueFd fd_;
  std::string buffer_;
};

class SocketServiceTest : public ::testing::Test {
 protected:
  std::unique_ptr<SocketService> start(int max_clients = 4) {
    auto service = std::make_unique<SocketService>(dir(), dir() + "/test.sock", SocketNames{"test socket", "[test].dir"},
                                                   handler_, max_clients);
    service->start();
    return service;
  }
  std::string dir() const { return tmp_.file("run"); }

  test::TempDir tmp_{"moed_socket_service"};
  EchoHandler handler_;
};

TEST_F(SocketServiceTest, AcceptsAdmitsServesAndCloses) {
  auto service = start();
  struct stat st {};
  ASSERT_EQ(::stat(service->path().c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  LineClient a(service->path()), b(service->path());
  EXPECT_EQ(a.call("hello"), "hello");
  EXPECT_EQ(b.call("world"), "world");
  EXPECT_EQ(a.call("again"), "again");
  ASSERT_TRUE(handler_.wait_until([&] { return handler_.serials.size() == 2; }));
  EXPECT_EQ(service->counters().connections, 2u);  // both answered: both held
  EXPECT_EQ(handler_.serials, (std::vector<std::uint64_t>{1, 2}));
  EXPECT_EQ(handler_.peers[0].pid, ::getpid());
  EXPECT_EQ(handler_.peers[0].uid, ::geteuid());
  // serve() says no: the service closes that connection and tells the handler.
  a.send("bye");
  EXPECT_EQ(a.read_line(), std::nullopt);
  EXPECT_TRUE(handler_.wait_until([&] { return handler_.closes == 1; }));
  EXPECT_EQ(service->counters().connections, 1u);
  EXPECT_EQ(b.call("still here"), "still here");
  EXPECT_EQ(service->counters().connection_errors, 0u);
}

TEST_F(SocketServiceTest, RefusesANewcomerWhenFullAndAdmitsOnceASlotIsFree) {
  auto service = start(2);
  LineClient a(service->path()), b(service->path());
  EXPECT_EQ(a.call("a"), "a");
  EXPECT_EQ(b.call("b"), "b");
  LineClient c(service->path());
  EXPECT_EQ(c.read_line(), "full");
  EXPECT_EQ(c.read_line(), std::nullopt);
  EXPECT_TRUE(handler_.wait_until([&] { return handler_.refused == 1; }));
  EXPECT_EQ(service->counters().connections, 2u);  // a refused newcomer is never one
  a.send("bye");
  ASSERT_TRUE(handler_.wait_until([&] { return handler_.closes == 1; }));
  LineClient d(service->path());
  EXPECT_EQ(d.call("d"), "d");
  EXPECT_EQ(b.call("b"), "b");
}

TEST_F(SocketServiceTest, AnEvicteeMakesRoomForTheNewcomer) {
  handler_.evict = true;
  auto service = start(1);
  LineClient first(service->path());
  EXPECT_EQ(first.call("first"), "first");
  LineClient second(service->path());
  EXPECT_EQ(second.call("second"), "second");
  EXPECT_EQ(first.read_line(), "evicted");
  EXPECT_EQ(first.read_line(), std::nullopt);
  EXPECT_TRUE(handler_.wait_until([&] { return handler_.closes == 1; }));
  EXPECT_EQ(handler_.refused, 0);
}

TEST_F(SocketServiceTest, AHandlerThatThrowsAnythingClosesOnlyItsConnection) {
  auto service = start();
  LineClient doomed(service->path()), bystander(service->path());
  EXPECT_EQ(doomed.call("x"), "x");
  EXPECT_EQ(bystander.call("y"), "y");
  doomed.send("throw");
  EXPECT_EQ(doomed.read_line(), std::nullopt);
  EXPECT_TRUE(handler_.wait_until([&] { return handler_.closes == 1; }));
  EXPECT_EQ(service->counters().connection_errors, 1u);
  EXPECT_EQ(bystander.call("y"), "y");
  // The same for admit: the newcomer is closed, nobody else.
  handler_.throw_on_admit = true;
  LineClient unlucky(service->path());
  EXPECT_EQ(unlucky.read_line(), std::nullopt);
  EXPECT_TRUE(
      test::wait_until([&] { return service->counters().connection_errors == 2; }, "the failed admit counted"));
  handler_.throw_on_admit = false;
  EXPECT_EQ(bystander.call("y"), "y");
  EXPECT_EQ(service->counters().loop_errors, 0u);
}

// poll() fails with EINVAL when it is given more fds than RLIMIT_NOFILE
// allows: the failure is counted and logged, and the loop goes on once the
// limit is back.
TEST_F(SocketServiceTest, APollErrorIsReportedAndTheLoopGoesOn) {
  auto service = start();
  rlimit saved{};
  ASSERT_EQ(::getrlimit(RLIMIT_NOFILE, &saved), 0);
  {
    struct Restore {
      rlimit limit;
      ~Restore() { ::setrlimit(RLIMIT_NOFILE, &limit); }
    } restore{saved};
    rlimit one = saved;
    one.rlim_cur = 1;  // the loop polls 2 fds: its wake-up and its listener
    ASSERT_EQ(::setrlimit(RLIMIT_NOFILE, &one), 0);
    service->wake();  // ends the poll that began under the old limit
    // No fd may be opened here.
    EXPECT_TRUE(test::wait_until([&] { return service->counters().loop_errors >= 1; }, "the failed poll() counted"));
  }
  LineClient c(service->path());
  EXPECT_EQ(c.call("served again"), "served again");
}

TEST_F(SocketServiceTest, WakeAndShutdownEndThePoll) {
  auto service = start();  // the handler lets a poll wait 60 s
  EXPECT_EQ(service->counters().turns, 0u);
  service->wake();
  ASSERT_TRUE(handler_.wait_until([&] { return handler_.wakes == 1; }));
  EXPECT_EQ(service->counters().turns, 1u);
  // stop() wakes the loop too: it returns long before the poll's 60 s.
  auto stopped = std::async(std::launch::async, [&] { service->stop(); });
  EXPECT_EQ(stopped.wait_for(10s), std::future_status::ready);
  stopped.get();
  service->stop();  // a second stop does nothing
  const std::string path = service->path();
  service.reset();
  EXPECT_NE(::access(path.c_str(), F_OK), 0) << "the socket file outlived the service";
}

// Runs as root only: a child that becomes 'nobody' (uid 65534) connects.
TEST_F(SocketServiceTest, APeerOfAnotherUidIsRefused) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to connect as another uid";
  auto service = start();
  ASSERT_EQ(::chmod(tmp_.path().c_str(), 0755), 0);
  ASSERT_EQ(::chmod(dir().c_str(), 0711), 0);
  ASSERT_EQ(::chmod(service->path().c_str(), 0666), 0);  // only the uid check stands in the way
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    // Only async-signal-safe calls from here: the parent has threads.
    if (::setgid(65534) != 0 || ::setuid(65534) != 0) ::_exit(10);
    const int s = ::socket(AF_UNIX, SOCK_STREAM, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::strncpy(addr.sun_path, service->path().c_str(), sizeof addr.sun_path - 1);
    if (::connect(s, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) ::_exit(11);
    char buffer[32];
    ssize_t total = 0, n;
    while (total < static_cast<ssize_t>(sizeof buffer) && (n = ::read(s, buffer + total, sizeof buffer - total)) > 0)
      total += n;
    ::_exit(total == 10 && std::memcmp(buffer, "forbidden\n", 10) == 0 ? 0 : 12);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0) << "10: setuid failed, 11: connect failed, 12: not refused as forbidden";
  EXPECT_TRUE(handler_.wait_until([&] { return handler_.refused == 1 && handler_.serials.empty(); }));
}

}  // namespace
}  // namespace moed
