// Many client links in one process opening and closing connections at once
// (client/ucx_am.h), as a client failing over between its homes does: each
// of --clients threads has a worker of its own and connects to a door (a
// child process: this program run with --serve), holds the connection for
// --hold-us while progressing and sending, and closes it, until --cycles
// have been made in all. UCX 1.13 aborted such a process ("Assertion
// `handler->async == async'") when one worker's closed socket number was
// reused by another worker while an event for it was still queued
// (client/ucx_am.cc's socket_registration): without that lock, within a
// second in every run on an idle machine. Exit 0: every cycle made; 1: not
// within --limit-s; an abort is the failure this checks for.
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include "client/ucx_am.h"

namespace {

using moed::netio::AmWorker;
using moed::netio::Event;
using moed::netio::Placement;
using moed::netio::UcxError;
using Clock = std::chrono::steady_clock;

Placement drop(ucp_ep_h, const moed::wire::Frame&, std::size_t) { return Placement{}; }

// The door: accepts every connection, closes those whose client left;
// writes its port to `port_fd`, then serves until killed.
int serve(int port_fd) {
  AmWorker door("socket-churn-door", "tcp", drop);
  const std::string port = std::to_string(door.listen(moed::netio::resolve("127.0.0.1:0"))) + "\n";
  if (::write(port_fd, port.data(), port.size()) != ssize_t(port.size())) return 1;
  ::close(port_fd);
  for (;;) {
    door.progress();
    for (Event& e : door.take_events()) {
      if (e.kind == Event::Kind::connection) {
        try {
          door.accept(e.request);
        } catch (const UcxError&) {  // the client has gone already
        }
      } else if (e.kind == Event::Kind::lost) {
        door.close(e.ep, false);
      }
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Client links opening and closing connections at once, in one process"};
  int clients = 6, cycles = 2000, hold_us = 300, limit_s = 120, serve_fd = -1;
  app.add_option("--clients", clients, "threads, each a worker of its own")->check(CLI::Range(1, 64));
  app.add_option("--cycles", cycles, "connections opened and closed in all")->check(CLI::Range(1, 1000000));
  app.add_option("--hold-us", hold_us, "how long a connection is progressed before it closes")
      ->check(CLI::Range(0, 1000000));
  app.add_option("--limit-s", limit_s, "fail when the cycles are not made within this")->check(CLI::Range(1, 3600));
  app.add_option("--serve", serve_fd, "(internal) run the door, writing its port to this descriptor");
  CLI11_PARSE(app, argc, argv);
  if (serve_fd >= 0) return serve(serve_fd);

  // The door runs in a process of its own (exec'd, so that no UCX state crosses the fork).
  int pipe_fds[2];
  if (::pipe(pipe_fds) != 0) return std::perror("pipe"), 2;
  const pid_t parent = ::getpid();
  const pid_t door = ::fork();
  if (door == 0) {
    // The door ends with this process, even when the abort this checks for
    // ends it: else it would spin on, orphaned.
    if (::prctl(PR_SET_PDEATHSIG, SIGKILL) != 0 || ::getppid() != parent) _exit(126);
    ::close(pipe_fds[0]);
    const std::string fd = std::to_string(pipe_fds[1]);
    ::execl("/proc/self/exe", argv[0], "--serve", fd.c_str(), static_cast<char*>(nullptr));
    _exit(127);
  }
  ::close(pipe_fds[1]);
  char text[16] = {};
  const ssize_t got = ::read(pipe_fds[0], text, sizeof text - 1);
  ::close(pipe_fds[0]);
  if (got <= 0) return std::fprintf(stderr, "socket_churn_check: the door did not start\n"), 1;
  const moed::netio::SocketAddress address =
      moed::netio::resolve("127.0.0.1:" + std::string(text, std::size_t(got - 1)));

  std::atomic<int> made{0};
  const Clock::time_point give_up = Clock::now() + std::chrono::seconds(limit_s);
  std::vector<std::thread> threads;
  for (int c = 0; c < clients; ++c)
    threads.emplace_back([&] {
      AmWorker link("socket-churn-client", "tcp", drop);
      while (made.load() < cycles && Clock::now() < give_up) {
        ucp_ep_h ep = nullptr;
        try {
          ep = link.connect(address);
        } catch (const UcxError&) {
          continue;
        }
        const Clock::time_point until = Clock::now() + std::chrono::microseconds(hold_us);
        bool lost = false;
        while (!lost && Clock::now() < until) {
          link.progress();
          for (Event& e : link.take_events()) lost = lost || e.kind == Event::Kind::lost;
          if (!lost) link.send(ep, std::vector<std::byte>(8), nullptr, 0, nullptr);  // traffic, so events come
        }
        link.close(ep, false);
        ++made;
      }
    });
  for (std::thread& t : threads) t.join();
  ::kill(door, SIGKILL);
  ::waitpid(door, nullptr, 0);
  std::printf("socket_churn_check: %d connections opened and closed by %d client links in one process\n",
              made.load(), clients);
  if (made.load() < cycles) {
    std::fprintf(stderr, "FAIL: %d of %d cycles within %d s\n", made.load(), cycles, limit_s);
    return 1;
  }
  return 0;
}
