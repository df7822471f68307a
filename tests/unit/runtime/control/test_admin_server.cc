// The admin socket server, for real: a server in a TempDir with fake handlers,
// and clients on raw sockets doing what bad clients do.
#include "runtime/control/admin_server.h"

#include <gtest/gtest.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "common/unique_fd.h"
#include "tests/unit/test_support.h"

namespace moed::runtime::admin {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

// A client on a raw socket: writes any bytes, reads lines with a deadline.
class RawClient {
 public:
  explicit RawClient(const std::string& path) {
    fd_.reset(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::strncpy(addr.sun_path, path.c_str(), sizeof addr.sun_path - 1);
    connected_ = ::connect(fd_.get(), reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0;
  }
  bool connected() const { return connected_; }
  int fd() const { return fd_.get(); }

  // False once the server has closed the connection.
  bool write(std::string_view bytes) {
    while (!bytes.empty()) {
      const ssize_t n = ::send(fd_.get(), bytes.data(), bytes.size(), MSG_NOSIGNAL);
      if (n <= 0) return false;
      bytes.remove_prefix(static_cast<std::size_t>(n));
    }
    return true;
  }
  // The next line, or nullopt on EOF or after `timeout`.
  std::optional<std::string> read_line(std::chrono::milliseconds timeout = 3000ms) {
    const auto deadline = Clock::now() + timeout;
    for (;;) {
      if (auto nl = buffer_.find('\n'); nl != std::string::npos) {
        std::string line = buffer_.substr(0, nl);
        buffer_.erase(0, nl + 1);
        return line;
      }
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
      if (left.count() <= 0) return std::nullopt;
      pollfd p{fd_.get(), POLLIN, 0};
      if (::poll(&p, 1, static_cast<int>(left.count())) <= 0) continue;
      char chunk[4096];
      const ssize_t n = ::recv(fd_.get(), chunk, sizeof chunk, 0);
      if (n <= 0) return std::nullopt;
      buffer_.append(chunk, static_cast<std::size_t>(n));
    }
  }
  json read_answer(std::chrono::milliseconds timeout = 3000ms) {
    auto line = read_line(timeout);
    if (!line) {
      ADD_FAILURE() << "no answer";
      return json();
    }
    return json::parse(*line);
  }
  json call(const std::string& line) {
    EXPECT_TRUE(write(line + "\n"));
    return read_answer();
  }
  // True when the server closes the connection within `timeout`.
  bool closed_by_server(std::chrono::milliseconds timeout = 3000ms) {
    const auto deadline = Clock::now() + timeout;
    while (Clock::now() < deadline) {
      pollfd p{fd_.get(), POLLIN, 0};
      if (::poll(&p, 1, 50) <= 0) continue;
      char chunk[4096];
      const ssize_t n = ::recv(fd_.get(), chunk, sizeof chunk, 0);
      if (n == 0 || (n < 0 && errno == ECONNRESET)) return true;
      if (n > 0) buffer_.append(chunk, static_cast<std::size_t>(n));
    }
    return false;
  }
  void close() { fd_.reset(); }

 private:
  UniqueFd fd_;
  bool connected_ = false;
  std::string buffer_;
};

// The daemon's side, faked: answers snapshots at once, queues control
// requests and lets the test reply to them from its own thread.
struct FakeDaemon {
  std::mutex mutex;
  std::condition_variable submitted_cv;
  std::vector<Request> snapshots;
  std::vector<std::pair<Request, Reply>> submitted;
  std::string metrics_text = "moed_tokens_total 42\n";

  Handlers handlers() {
    Handlers h;
    h.snapshot_answer = [this](const Request& r) -> json {
      std::lock_guard lock(mutex);
      snapshots.push_back(r);
      if (r.cmd == "metrics") return {{"text", metrics_text}};
      if (r.cmd == "stats" && r.params.contains("dump")) return error_body("refused", "disk full");
      if (r.cmd == "placement") throw std::runtime_error("no placement yet");
      return {{"rank", 0}, {"epoch", 3}, {"cmd_seen", r.cmd}};
    };
    h.submit = [this](Request r, Reply reply) {
      {
        std::lock_guard lock(mutex);
        submitted.emplace_back(std::move(r), std::move(reply));
      }
      submitted_cv.notify_all();
    };
    return h;
  }
  std::size_t snapshot_count() {
    std::lock_guard lock(mutex);
    return snapshots.size();
  }
  // Waits for the n-th submitted request (1-based) and returns it.
  std::pair<Request, Reply> wait_submitted(std::size_t n) {
    std::unique_lock lock(mutex);
    submitted_cv.wait_for(lock, 3s, [&] { return submitted.size() >= n; });
    if (submitted.size() < n) {
      ADD_FAILURE() << "submit() was not called";
      return {};
    }
    return submitted[n - 1];
  }
};

class AdminServerTest : public ::testing::Test {
 protected:
  std::unique_ptr<AdminServer> start(int rank = 0, Limits limits = {}) {
    return std::make_unique<AdminServer>(dir(), rank, 0, daemon_.handlers(), limits);
  }
  std::string dir() const { return tmp_.file("run"); }

  // Waits for the server to have read `bytes` request bytes since it started
  // (and handled the lines they end).
  static bool server_has_read(const AdminServer& server, std::uint64_t bytes) {
    return test::wait_until([&] { return server.counters().bytes_read >= bytes; },
                            "the server to have read " + std::to_string(bytes) + " request bytes");
  }
  // Waits for the server to hold `n` connections (after clients went: to have closed theirs).
  static bool server_holds(const AdminServer& server, std::uint64_t n) {
    return test::wait_until([&] { return server.counters().clients == n; },
                            "the server to hold " + std::to_string(n) + " connections");
  }

  test::TempDir tmp_{"moed_admin"};
  FakeDaemon daemon_;
};

TEST_F(AdminServerTest, SocketAndDirArePrivate) {
  auto server = start(2);
  EXPECT_EQ(server->path(), dir() + "/moed-2.sock");
  struct stat st {};
  ASSERT_EQ(::stat(server->path().c_str(), &st), 0);
  EXPECT_TRUE(S_ISSOCK(st.st_mode));
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  ASSERT_EQ(::stat(dir().c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0700u);
}

TEST_F(AdminServerTest, RoundTripEchoesStringAndIntegerIds) {
  auto server = start();
  RawClient c(server->path());
  ASSERT_TRUE(c.connected());
  json a = c.call(R"({"id":"req-1","cmd":"status"})");
  EXPECT_EQ(a["id"], "req-1");
  EXPECT_EQ(a["ok"], true);
  EXPECT_EQ(a["epoch"], 3);
  a = c.call(R"({"id":77,"cmd":"metrics"})");
  EXPECT_EQ(a["id"], 77);
  EXPECT_EQ(a["text"], "moed_tokens_total 42\n");
  a = c.call(R"({"cmd":"status"})");
  EXPECT_EQ(a["id"], nullptr);
  EXPECT_EQ(daemon_.snapshot_count(), 3u);
}

TEST_F(AdminServerTest, TwoRequestsInOneWriteAndOneSplitOverManyWrites) {
  auto server = start();
  RawClient c(server->path());
  ASSERT_TRUE(c.write("{\"id\":1,\"cmd\":\"status\"}\n{\"id\":2,\"cmd\":\"metrics\"}\n"));
  EXPECT_EQ(c.read_answer()["id"], 1);
  EXPECT_EQ(c.read_answer()["id"], 2);
  const std::string line = "{\"id\":3,\"cmd\":\"status\"}\n";
  const std::uint64_t read_before = server->counters().bytes_read;
  for (std::size_t i = 0; i < line.size(); ++i) {
    ASSERT_TRUE(c.write(std::string(1, line[i])));
    ASSERT_TRUE(server_has_read(*server, read_before + i + 1));  // each byte a read of its own
  }
  EXPECT_EQ(c.read_answer()["id"], 3);
  // Blank lines are skipped silently; CRLF works.
  ASSERT_TRUE(c.write("\n  \r\n{\"id\":4,\"cmd\":\"status\"}\r\n"));
  EXPECT_EQ(c.read_answer()["id"], 4);
}

TEST_F(AdminServerTest, GarbageGetsBadJsonAndTheConnectionStaysUsable) {
  auto server = start();
  RawClient c(server->path());
  for (const std::string garbage : {"hello", "{\"cmd\":", "[1,2,3]", "\x01\x02\xff\xfe", "{}{}"}) {
    json a = c.call(garbage);
    EXPECT_EQ(a["ok"], false) << garbage;
    EXPECT_EQ(a["id"], nullptr);
    EXPECT_EQ(a["error"]["code"], "bad_json") << garbage;
  }
  EXPECT_EQ(c.call(R"({"id":5,"cmd":"status"})")["ok"], true);
}

TEST_F(AdminServerTest, LineOverTheLimitGetsLineTooLongAndClose) {
  Limits limits;
  limits.max_line = 1024;
  auto server = start(0, limits);
  {  // a complete line over the limit
    RawClient c(server->path());
    json a = c.call(R"({"cmd":"status","x":")" + std::string(2000, 'a') + "\"}");
    EXPECT_EQ(a["error"]["code"], "line_too_long");
    EXPECT_TRUE(c.closed_by_server());
  }
  {  // a line that never ends: refused as soon as it passes the limit
    RawClient c(server->path());
    ASSERT_TRUE(c.write(std::string(3000, ' ')));
    json a = c.read_answer();
    EXPECT_EQ(a["error"]["code"], "line_too_long");
    EXPECT_NE(a["error"]["message"].get<std::string>().find("1024"), std::string::npos);
    EXPECT_TRUE(c.closed_by_server());
  }
  EXPECT_EQ(server->counters().lines_too_long, 2u);
  EXPECT_EQ(daemon_.snapshot_count(), 0u);
  RawClient other(server->path());
  EXPECT_EQ(other.call(R"({"cmd":"status"})")["ok"], true);
}

TEST_F(AdminServerTest, UnknownCommandAndBadParams) {
  auto server = start();
  RawClient c(server->path());
  json a = c.call(R"({"id":1,"cmd":"reboot"})");
  EXPECT_EQ(a["error"]["code"], "unknown_command");
  EXPECT_EQ(a["id"], 1);
  for (const std::string bad :
       {R"({"id":2,"cmd":"migrate","layer":0,"expert":1})",                   // missing
        R"({"id":2,"cmd":"migrate","layer":"0","expert":1,"to":1})",          // ill-typed
        R"({"id":2,"cmd":"migrate","layer":0,"expert":1,"to":-1})",           // out of range
        R"({"id":2,"cmd":"status","layer":0})",                               // unknown
        R"({"id":2,"cmd":"reoptimize","policy":"random"})"}) {                // not a choice
    a = c.call(bad);
    EXPECT_EQ(a["error"]["code"], "bad_params") << bad;
    EXPECT_EQ(a["id"], 2);
  }
  EXPECT_TRUE(daemon_.submitted.empty());
  EXPECT_EQ(daemon_.snapshot_count(), 0u);
}

TEST_F(AdminServerTest, HandlerErrorsBecomeErrorAnswers) {
  auto server = start();
  RawClient c(server->path());
  json a = c.call(R"({"id":1,"cmd":"stats","dump":"/nowhere/s.json"})");
  EXPECT_EQ(a["error"]["code"], "refused");
  EXPECT_EQ(a["error"]["message"], "disk full");
  a = c.call(R"({"id":2,"cmd":"placement"})");  // the handler throws
  EXPECT_EQ(a["error"]["code"], "internal");
  EXPECT_EQ(a["error"]["message"], "no placement yet");
  EXPECT_EQ(c.call(R"({"id":3,"cmd":"status"})")["ok"], true);
}

TEST_F(AdminServerTest, ControlCommandsOnAnotherRankGetNotCoordinator) {
  auto server = start(3);
  RawClient c(server->path());
  for (const std::string cmd : {"drain", "shutdown", "reoptimize"}) {
    json a = c.call(R"({"id":1,"cmd":")" + cmd + "\"}");
    EXPECT_EQ(a["error"]["code"], "not_coordinator") << cmd;
    EXPECT_NE(a["error"]["message"].get<std::string>().find(dir() + "/moed-0.sock"), std::string::npos);
  }
  json a = c.call(R"({"id":1,"cmd":"migrate","layer":0,"expert":0,"to":1})");
  EXPECT_EQ(a["error"]["code"], "not_coordinator");
  EXPECT_TRUE(daemon_.submitted.empty());
  // Snapshots are answered on every rank.
  EXPECT_EQ(c.call(R"({"cmd":"status"})")["ok"], true);
}

TEST_F(AdminServerTest, ControlCommandReplyComesLaterFromAnotherThread) {
  auto server = start();
  RawClient c(server->path());
  ASSERT_TRUE(c.write(R"({"id":"m1","cmd":"migrate","layer":1,"expert":2,"to":3})" "\n"));
  auto [request, reply] = daemon_.wait_submitted(1);
  EXPECT_EQ(request.cmd, "migrate");
  EXPECT_EQ(request.params, json({{"layer", 1}, {"expert", 2}, {"to", 3}}));
  EXPECT_FALSE(c.read_line(50ms)) << "answered before the daemon decided";
  std::thread step_loop([&, id = request.id, reply = reply] {
    std::this_thread::sleep_for(20ms);  // usually after the client waits; either order passes
    reply(answer_ok(id, {{"migration", 9}}));
  });
  json a = c.read_answer();
  step_loop.join();
  EXPECT_EQ(a["id"], "m1");
  EXPECT_EQ(a["ok"], true);
  EXPECT_EQ(a["migration"], 9);
  reply(answer_ok(request.id, {}));  // a second reply is dropped
  EXPECT_EQ(c.call(R"({"id":2,"cmd":"status"})")["id"], 2);
}

TEST_F(AdminServerTest, AnswersFollowTheOrderOfRequests) {
  auto server = start();
  RawClient c(server->path());
  ASSERT_TRUE(c.write("{\"id\":1,\"cmd\":\"drain\"}\n{\"id\":2,\"cmd\":\"status\"}\n"));
  auto [request, reply] = daemon_.wait_submitted(1);
  EXPECT_FALSE(c.read_line(50ms)) << "the status answer overtook the drain";
  reply(answer_error(request.id, "busy", "a migration runs"));
  json first = c.read_answer(), second = c.read_answer();
  EXPECT_EQ(first["id"], 1);
  EXPECT_EQ(first["error"]["code"], "busy");
  EXPECT_EQ(second["id"], 2);
}

TEST_F(AdminServerTest, TooManyControlRequestsInFlight) {
  Limits limits;
  limits.max_in_flight = 2;
  auto server = start(0, limits);
  RawClient c(server->path());
  ASSERT_TRUE(c.write("{\"id\":1,\"cmd\":\"drain\"}\n{\"id\":2,\"cmd\":\"drain\"}\n{\"id\":3,\"cmd\":\"drain\"}\n"));
  auto first = daemon_.wait_submitted(1);
  auto second = daemon_.wait_submitted(2);
  first.second(answer_ok(first.first.id, {}));
  second.second(answer_ok(second.first.id, {}));
  EXPECT_EQ(c.read_answer()["id"], 1);
  EXPECT_EQ(c.read_answer()["id"], 2);
  json third = c.read_answer();
  EXPECT_EQ(third["id"], 3);
  EXPECT_EQ(third["error"]["code"], "too_many_requests");
}

TEST_F(AdminServerTest, ClientGoneBeforeItsReplyCrashesNothing) {
  Reply late;
  json id;
  {
    auto server = start();
    {
      RawClient c(server->path());
      ASSERT_TRUE(c.write(R"({"id":1,"cmd":"shutdown"})" "\n"));
      auto [request, reply] = daemon_.wait_submitted(1);
      late = reply;
      id = request.id;
    }  // the client goes
    ASSERT_TRUE(server_holds(*server, 0));
    late(answer_ok(id, {}));  // dropped
    RawClient other(server->path());
    EXPECT_EQ(other.call(R"({"id":2,"cmd":"status"})")["id"], 2);
  }
  late(answer_ok(id, {}));  // the server has gone too
}

// A peer gone while its control request waits for the daemon: the server
// must sleep, not spin on the hang-up, until the reply comes.
TEST_F(AdminServerTest, NoSpinningOnGoneOrIdleClients) {
  Limits limits;
  limits.max_line = 64;
  auto server = start(0, limits);
  // Two windows of time on purpose: the turns in them are what is measured
  // (a loaded machine makes fewer turns, not more).
  std::this_thread::sleep_for(200ms);
  EXPECT_LE(server->counters().turns, 3u) << "an idle server woke up";
  {
    RawClient c(server->path());
    ASSERT_TRUE(c.write("{\"id\":1,\"cmd\":\"drain\"}\n" + std::string(100, 'x')));
    daemon_.wait_submitted(1);
  }  // in flight, line too long, then gone
  const auto before = server->counters().turns;
  std::this_thread::sleep_for(200ms);
  EXPECT_LE(server->counters().turns - before, 5u) << "the server spins";
  auto [request, reply] = daemon_.wait_submitted(1);
  reply(answer_ok(request.id, {}));
  RawClient other(server->path());
  EXPECT_EQ(other.call(R"({"cmd":"status"})")["ok"], true);
}

TEST_F(AdminServerTest, PendingControlRequestsGetShuttingDownWhenTheServerStops) {
  auto server = start();
  RawClient c(server->path());
  ASSERT_TRUE(c.write(R"({"id":1,"cmd":"drain"})" "\n"));
  daemon_.wait_submitted(1);
  server.reset();
  json a = c.read_answer();
  EXPECT_EQ(a["error"]["code"], "shutting_down");
  EXPECT_TRUE(c.closed_by_server());
}

TEST_F(AdminServerTest, HundredClientsAtOnceExtrasGetAnErrorLine) {
  auto server = start();  // max_clients 64
  std::vector<std::unique_ptr<RawClient>> clients;
  for (int i = 0; i < 100; ++i) {
    clients.push_back(std::make_unique<RawClient>(server->path()));
    ASSERT_TRUE(clients.back()->connected()) << i;
  }
  int served = 0, refused = 0;
  for (auto& c : clients) {
    c->write(R"({"cmd":"status"})" "\n");  // may fail on a refused one
    json a = c->read_answer();
    if (a.value("ok", false)) {
      ++served;
    } else {
      EXPECT_EQ(a["error"]["code"], "too_many_clients");
      ++refused;
    }
  }
  EXPECT_EQ(served, 64);
  EXPECT_EQ(refused, 36);
  EXPECT_EQ(server->counters().refused_full, 36u);
  clients.clear();
  // Their places are free again, once the server has seen them go.
  ASSERT_TRUE(server_holds(*server, 0));
  RawClient late(server->path());
  EXPECT_EQ(late.call(R"({"cmd":"status"})")["ok"], true);
}

TEST_F(AdminServerTest, SlowClientDoesNotDelayOthers) {
  auto server = start();
  // The slow client dribbles its line a byte per fast call: the fast client
  // gets every answer while that line is still unfinished (a server waiting
  // for it would leave the fast client's call without an answer).
  RawClient slow(server->path());
  const std::string line = R"({"id":"slow","cmd":"status","pad":")" + std::string(400, 'x') + "\"}\n";
  RawClient fast(server->path());
  for (int i = 0; i < 20; ++i) {
    ASSERT_TRUE(slow.write(std::string(1, line[std::size_t(i)])));
    json a = fast.call(R"({"id":1,"cmd":"status"})");
    ASSERT_EQ(a["ok"], true) << "call " << i << " while a client dribbles";
  }
  EXPECT_FALSE(slow.read_line(10ms)) << "the slow line is unfinished: no answer yet";
  ASSERT_TRUE(slow.write(line.substr(20)));
  EXPECT_EQ(slow.read_answer()["id"], "slow");
}

TEST_F(AdminServerTest, ClientThatNeverReadsIsDroppedOthersKeepWorking) {
  Limits limits;
  limits.max_pending_bytes = 64 * 1024;
  auto server = start(0, limits);
  daemon_.metrics_text = std::string(16 * 1024, 'm');
  RawClient hog(server->path());
  const std::string request = std::string(R"({"cmd":"metrics"})") + "\n";
  // The hog only writes: its answers pile up in the socket buffers, then in
  // the server's queue, until the server drops it and the writes fail.
  bool dropped = false;
  const auto deadline = Clock::now() + 10s;
  while (Clock::now() < deadline) {
    pollfd p{hog.fd(), POLLOUT, 0};
    if (::poll(&p, 1, 100) <= 0) continue;
    if (p.revents & (POLLERR | POLLHUP)) {
      dropped = true;
      break;
    }
    if (::send(hog.fd(), request.data(), request.size(), MSG_NOSIGNAL | MSG_DONTWAIT) < 0 &&
        errno != EAGAIN) {
      dropped = true;
      break;
    }
  }
  EXPECT_TRUE(dropped);
  EXPECT_EQ(server->counters().dropped_slow, 1u);
  RawClient other(server->path());
  EXPECT_EQ(other.call(R"({"id":1,"cmd":"status"})")["ok"], true);
}

TEST_F(AdminServerTest, HandlersNeverSeeIncompleteLines) {
  auto server = start();
  RawClient c(server->path());
  const std::string unfinished = R"({"id":1,"cmd":"status"})";
  ASSERT_TRUE(c.write(unfinished));  // no newline yet
  ASSERT_TRUE(server_has_read(*server, unfinished.size()));
  EXPECT_EQ(daemon_.snapshot_count(), 0u);
  EXPECT_FALSE(c.read_line(10ms));
  ASSERT_TRUE(c.write("\n"));
  EXPECT_EQ(c.read_answer()["id"], 1);
  EXPECT_EQ(daemon_.snapshot_count(), 1u);

  // A connection that ends in the middle of a control command: never submitted.
  RawClient cut(server->path());
  ASSERT_TRUE(cut.write(R"({"id":2,"cmd":"shutdown"})"));
  ::shutdown(cut.fd(), SHUT_WR);
  json a = cut.read_answer();
  EXPECT_EQ(a["error"]["code"], "bad_json");
  EXPECT_TRUE(cut.closed_by_server());
  EXPECT_TRUE(daemon_.submitted.empty());
}

TEST_F(AdminServerTest, HalfClosedClientStillGetsItsAnswers) {
  auto server = start();
  RawClient c(server->path());
  ASSERT_TRUE(c.write("{\"id\":1,\"cmd\":\"status\"}\n{\"id\":2,\"cmd\":\"drain\"}\n"));
  ::shutdown(c.fd(), SHUT_WR);
  EXPECT_EQ(c.read_answer()["id"], 1);
  auto [request, reply] = daemon_.wait_submitted(1);
  reply(answer_ok(request.id, {{"state", "draining"}}));
  json a = c.read_answer();
  EXPECT_EQ(a["id"], 2);
  EXPECT_EQ(a["state"], "draining");
  EXPECT_TRUE(c.closed_by_server());
}

TEST_F(AdminServerTest, IdleClientsTimeOut) {
  Limits limits;
  limits.idle_timeout_ms = 100;
  auto server = start(0, limits);
  RawClient idle(server->path());
  const auto t0 = Clock::now();  // before the last byte either way: idleness starts after it
  EXPECT_EQ(idle.call(R"({"cmd":"status"})")["ok"], true);
  EXPECT_TRUE(idle.closed_by_server(2s));
  EXPECT_GE(Clock::now() - t0, 50ms);
  EXPECT_EQ(server->counters().closed_idle, 1u);
}

// A client that sends a byte now and then is never idle; the line timeout
// still closes it.
TEST_F(AdminServerTest, ALineTooSlowToFinishIsClosed) {
  Limits limits;
  limits.line_timeout_ms = 300;
  auto server = start(0, limits);
  RawClient slow(server->path());
  const auto t0 = Clock::now();
  bool closed = false;
  for (int i = 0; i < 40 && !closed; ++i) {  // a byte every 50 ms, never a newline
    closed = !slow.write("{");
    if (!closed) closed = slow.closed_by_server(50ms);
  }
  EXPECT_TRUE(closed);
  EXPECT_GE(Clock::now() - t0, 250ms);
  EXPECT_EQ(server->counters().closed_slow_line, 1u);
  // A line finished in time is served, however it is split (on a server
  // whose line timeout leaves the pause far inside it): its first part is
  // read before the rest is sent.
  server.reset();
  server = start();
  RawClient fine(server->path());
  const std::string first_part = R"({"cmd":)";
  EXPECT_TRUE(fine.write(first_part));
  ASSERT_TRUE(server_has_read(*server, first_part.size()));
  EXPECT_EQ(fine.call(R"("status"})")["ok"], true);
}

// Every slot held by clients trickling bytes (the lockout a hostile tester
// found): a new client takes the slot of the oldest unfinished line.
TEST_F(AdminServerTest, TricklingClientsCannotLockTheOperatorOut) {
  Limits limits;
  limits.max_clients = 4;
  auto server = start(0, limits);
  std::vector<std::unique_ptr<RawClient>> tricklers;
  for (std::uint64_t i = 0; i < 4; ++i) {
    tricklers.push_back(std::make_unique<RawClient>(server->path()));
    ASSERT_TRUE(tricklers.back()->write("{"));
    // Read before the next one writes: each unfinished line starts after the last.
    ASSERT_TRUE(server_has_read(*server, i + 1));
  }
  RawClient operator_client(server->path());
  EXPECT_EQ(operator_client.call(R"({"cmd":"status"})")["ok"], true);
  EXPECT_EQ(server->counters().evicted, 1u);
  // Exactly one trickler lost its slot, told why: the first, whose line is the oldest.
  int evicted = 0;
  for (auto& t : tricklers) {
    auto line = t->read_line(100ms);
    if (!line) continue;
    EXPECT_EQ(json::parse(*line)["error"]["code"], "evicted");
    EXPECT_TRUE(t->closed_by_server());
    ++evicted;
    t.reset();
  }
  EXPECT_EQ(evicted, 1);
  EXPECT_EQ(tricklers[0], nullptr) << "the oldest unfinished line was not the one evicted";
  // The others keep their slots and can finish their lines.
  for (auto& t : tricklers)
    if (t) {
      EXPECT_EQ(t->call(R"("cmd":"status"})")["ok"], true);
    }
  // (Clients without an unfinished line are never evicted: HundredClientsAtOnce...)
}

TEST_F(AdminServerTest, StaleSocketIsReplacedLiveOneRefused) {
  ASSERT_EQ(::mkdir(dir().c_str(), 0700), 0);
  const std::string path = socket_path(dir(), 0);
  {  // a socket file whose daemon died: bound, never unlinked
    UniqueFd s(::socket(AF_UNIX, SOCK_STREAM, 0));
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::strncpy(addr.sun_path, path.c_str(), sizeof addr.sun_path - 1);
    ASSERT_EQ(::bind(s.get(), reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  }
  auto server = start();
  RawClient c(server->path());
  EXPECT_EQ(c.call(R"({"cmd":"status"})")["ok"], true);
  test::expect_error([&] { start(); }, ErrorKind::Runtime, {"already listening", path});
  // The refused second server did not remove the first one's socket.
  RawClient again(server->path());
  EXPECT_EQ(again.call(R"({"cmd":"status"})")["ok"], true);
}

TEST_F(AdminServerTest, RefusesUnsafeDirsAndPaths) {
  ASSERT_EQ(::mkdir(dir().c_str(), 0700), 0);
  const std::string path = socket_path(dir(), 0);
  tmp_.write("run/moed-0.sock", "not a socket");
  test::expect_error([&] { start(); }, ErrorKind::Usage, {path, "not a socket"});
  ::unlink(path.c_str());

  ASSERT_EQ(::chmod(dir().c_str(), 0777), 0);
  test::expect_error([&] { start(); }, ErrorKind::Usage, {dir(), "writable by group or others", "0777"});
  ASSERT_EQ(::chmod(dir().c_str(), 0700), 0);

  const std::string link = tmp_.file("link");
  ASSERT_EQ(::symlink(dir().c_str(), link.c_str()), 0);
  test::expect_error([&] { AdminServer(link, 0, 0, daemon_.handlers()); }, ErrorKind::Usage,
                     {link, "symbolic link"});

  const std::string file = tmp_.write("plain", "x");
  test::expect_error([&] { AdminServer(file, 0, 0, daemon_.handlers()); }, ErrorKind::Usage,
                     {file, "not a directory"});

  const std::string deep = tmp_.file(std::string(120, 'd'));
  test::expect_error([&] { AdminServer(deep, 0, 0, daemon_.handlers()); }, ErrorKind::Usage,
                     {"too long"});
}

TEST_F(AdminServerTest, CreatesMissingParentsAndDestructorUnlinks) {
  const std::string nested = tmp_.file("a/b/run");
  std::string path;
  {
    AdminServer server(nested, 1, 0, daemon_.handlers());
    path = server.path();
    EXPECT_EQ(::access(path.c_str(), F_OK), 0);
  }
  EXPECT_NE(::access(path.c_str(), F_OK), 0);
  EXPECT_EQ(errno, ENOENT);
}

// Runs as root only: a child that becomes 'nobody' (uid 65534) connects.
TEST_F(AdminServerTest, PeerWithAnotherUidIsForbidden) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to connect as another uid";
  auto server = start();
  // nobody must reach the socket file to connect at all; the peer uid check
  // is what must stop it.
  ASSERT_EQ(::chmod(tmp_.path().c_str(), 0755), 0);
  ASSERT_EQ(::chmod(dir().c_str(), 0711), 0);
  ASSERT_EQ(::chmod(server->path().c_str(), 0666), 0);
  int pipe_fds[2];
  ASSERT_EQ(::pipe(pipe_fds), 0);
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    // Only async-signal-safe calls from here: the parent has threads.
    ::close(pipe_fds[0]);
    if (::setgid(65534) != 0 || ::setuid(65534) != 0) ::_exit(10);
    const int s = ::socket(AF_UNIX, SOCK_STREAM, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::strncpy(addr.sun_path, server->path().c_str(), sizeof addr.sun_path - 1);
    if (::connect(s, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) ::_exit(11);
    const char request[] = "{\"cmd\":\"status\"}\n";
    [[maybe_unused]] auto w = ::send(s, request, sizeof request - 1, MSG_NOSIGNAL);
    char buffer[512];
    ssize_t total = 0, n;
    while (total < static_cast<ssize_t>(sizeof buffer) &&
           (n = ::read(s, buffer + total, sizeof buffer - total)) > 0)
      total += n;
    [[maybe_unused]] auto w2 = ::write(pipe_fds[1], buffer, static_cast<std::size_t>(total));
    ::_exit(0);
  }
  ::close(pipe_fds[1]);
  std::string got;
  char buffer[512];
  ssize_t n;
  while ((n = ::read(pipe_fds[0], buffer, sizeof buffer)) > 0) got.append(buffer, n);
  ::close(pipe_fds[0]);
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status));
  ASSERT_EQ(WEXITSTATUS(status), 0) << "10: setuid failed, 11: connect failed";
  ASSERT_FALSE(got.empty());
  json a = json::parse(got.substr(0, got.find('\n')));
  EXPECT_EQ(a["ok"], false);
  EXPECT_EQ(a["error"]["code"], "forbidden");
  EXPECT_NE(a["error"]["message"].get<std::string>().find("65534"), std::string::npos);
  EXPECT_EQ(server->counters().refused_uid, 1u);
  EXPECT_EQ(daemon_.snapshot_count(), 0u);
}

}  // namespace
}  // namespace moed::runtime::admin
