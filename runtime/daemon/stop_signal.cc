#include "runtime/daemon/stop_signal.h"

#include <csignal>

namespace moed::runtime {

namespace {

volatile std::sig_atomic_t received = 0;
volatile std::sig_atomic_t seen_term = 0, seen_int = 0;

void on_stop_signal(int signal) {
  // The same signal twice: the operator insists; die as its default would.
  // (SIGUSR2 is what launchers forward; it never escalates, so a Ctrl-C that
  // reaches the ranks both directly and through the launcher drains once.)
  volatile std::sig_atomic_t* seen = signal == SIGTERM ? &seen_term : signal == SIGINT ? &seen_int : nullptr;
  if (seen && *seen) {
    std::signal(signal, SIG_DFL);
    std::raise(signal);
    return;
  }
  if (seen) *seen = 1;
  if (received == 0) received = signal;
}

}  // namespace

void install_stop_signals() {
  struct sigaction action {};
  action.sa_handler = on_stop_signal;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART;  // blocking calls go on; the loop checks the flag
  sigaction(SIGTERM, &action, nullptr);
  sigaction(SIGINT, &action, nullptr);
  sigaction(SIGUSR2, &action, nullptr);
}

int stop_signal() { return received; }

const char* signal_name(int signal) {
  switch (signal) {
    case SIGTERM: return "SIGTERM";
    case SIGINT: return "SIGINT";
    case SIGUSR2: return "SIGUSR2 (a SIGTERM or SIGINT that moed-mpirun passed on)";
    default: return "a signal";
  }
}

}  // namespace moed::runtime
