// The stop signals' handler, in child processes (a handler is process-wide).
#include "runtime/daemon/stop_signal.h"

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <csignal>
#include <functional>

namespace moed::runtime {
namespace {

// Runs `body` in a forked child; returns its wait status.
int in_child(const std::function<int()>& body) {
  const pid_t pid = ::fork();
  if (pid == 0) ::_exit(body());
  int status = 0;
  ::waitpid(pid, &status, 0);
  return status;
}

TEST(StopSignal, TheFirstSignalIsRecordedNotFatal) {
  for (int sig : {SIGTERM, SIGINT, SIGUSR2}) {
    const int status = in_child([sig] {
      install_stop_signals();
      if (stop_signal() != 0) return 10;
      std::raise(sig);
      return stop_signal() == sig ? 0 : 11;
    });
    ASSERT_TRUE(WIFEXITED(status)) << sig;
    EXPECT_EQ(WEXITSTATUS(status), 0) << sig;
  }
}

TEST(StopSignal, TheSameSignalTwiceEndsTheProcess) {
  for (int sig : {SIGTERM, SIGINT}) {
    const int status = in_child([sig] {
      install_stop_signals();
      std::raise(sig);
      std::raise(sig);
      return 0;  // not reached
    });
    ASSERT_TRUE(WIFSIGNALED(status)) << sig;
    EXPECT_EQ(WTERMSIG(status), sig);
  }
}

// What a launcher forwards never escalates: a Ctrl-C reaching the ranks both
// directly and as the launcher's SIGUSR2 drains once.
TEST(StopSignal, ForwardedSignalsAndMixesDoNotEscalate) {
  const int status = in_child([] {
    install_stop_signals();
    std::raise(SIGINT);
    std::raise(SIGUSR2);
    std::raise(SIGUSR2);
    std::raise(SIGTERM);
    return stop_signal() == SIGINT ? 0 : 12;  // the first one is kept
  });
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0);
  EXPECT_STREQ(signal_name(SIGTERM), "SIGTERM");
}

}  // namespace
}  // namespace moed::runtime
