// Waiting without starving the ranks that work. A wait spins first (answers
// that come within microseconds are taken at once), then yields, then sleeps
// briefly between polls. Where ranks outnumber cores (CI, the emulated
// cluster, a rank beside its node's other daemons), a waiter that only spins
// takes the core the rank it waits for needs; sched_yield alone does not give
// it back under CFS.
#pragma once

#include <sched.h>

#include <chrono>
#include <thread>

namespace moed::comm {

class IdleBackoff {
 public:
  // After a poll that found nothing to do.
  void idle() {
    ++idle_polls_;
    if (idle_polls_ > kSleepAfter)
      std::this_thread::sleep_for(std::chrono::microseconds(kSleepMicros));
    else if (idle_polls_ > kYieldAfter)
      sched_yield();
  }
  // After a poll that made progress.
  void reset() { idle_polls_ = 0; }

 private:
  static constexpr int kYieldAfter = 32, kSleepAfter = 2048, kSleepMicros = 20;
  int idle_polls_ = 0;
};

}  // namespace moed::comm
