// Waiting without starving the ranks that work. A wait spins first (answers
// that come within microseconds are taken at once), then yields, then sleeps
// between polls, each sleep twice the last up to a cap: a short wait stays
// responsive, and a long one (a rank idle while its peers run their experts)
// wakes rarely instead of taking the core from a working rank thousands of
// times a second. Where ranks outnumber cores (CI, the emulated
// cluster, a rank beside its node's other daemons), a waiter that only spins
// takes the core the rank it waits for needs; sched_yield alone does not give
// it back under CFS.
#pragma once

#include <sched.h>

#include <chrono>
#include <cstdint>
#include <thread>

namespace moed::comm {

// [comm].wait_*: how a wait polls. Set once at start-up, before any wait
// (set_wait_policy); every wait starts afresh with the spinning polls.
struct WaitPolicy {
  std::int64_t spin_polls = 32, yield_polls = 2048, sleep_us = 20, sleep_max_us = 1000;
};
void set_wait_policy(const WaitPolicy& policy);
const WaitPolicy& wait_policy();

// What a wait does after its idle_polls-th idle poll (1, 2, ...): spin on,
// yield the core, or sleep `us` microseconds.
struct Pause {
  enum Kind { spin, yield, sleep } kind;
  std::int64_t us = 0;
};
Pause pause_after(std::int64_t idle_polls, const WaitPolicy& policy);

class IdleBackoff {
 public:
  IdleBackoff() : policy_(wait_policy()) {}
  // After a poll that found nothing to do.
  void idle() {
    const Pause pause = pause_after(++idle_polls_, policy_);
    if (pause.kind == Pause::sleep)
      std::this_thread::sleep_for(std::chrono::microseconds(pause.us));
    else if (pause.kind == Pause::yield)
      sched_yield();
  }
  // After a poll that made progress.
  void reset() { idle_polls_ = 0; }

 private:
  WaitPolicy policy_;
  std::int64_t idle_polls_ = 0;
};

}  // namespace moed::comm
