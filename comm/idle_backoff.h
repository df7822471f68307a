// Waiting without starving the ranks that work. A wait spins first (answers
// that come within microseconds are taken at once), then yields, then sleeps
// briefly between polls. Where ranks outnumber cores (CI, the emulated
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
  std::int64_t spin_polls = 32, yield_polls = 2048, sleep_us = 20;
};
void set_wait_policy(const WaitPolicy& policy);
const WaitPolicy& wait_policy();

class IdleBackoff {
 public:
  IdleBackoff() : policy_(wait_policy()) {}
  // After a poll that found nothing to do.
  void idle() {
    ++idle_polls_;
    if (idle_polls_ > policy_.spin_polls + policy_.yield_polls)
      std::this_thread::sleep_for(std::chrono::microseconds(policy_.sleep_us));
    else if (idle_polls_ > policy_.spin_polls)
      sched_yield();
  }
  // After a poll that made progress.
  void reset() { idle_polls_ = 0; }

 private:
  WaitPolicy policy_;
  std::int64_t idle_polls_ = 0;
};

}  // namespace moed::comm
