#include "comm/idle_backoff.h"

#include <algorithm>

namespace moed::comm {

namespace {
WaitPolicy g_policy;
}

void set_wait_policy(const WaitPolicy& policy) { g_policy = policy; }

const WaitPolicy& wait_policy() { return g_policy; }

Pause pause_after(std::int64_t idle_polls, const WaitPolicy& policy) {
  if (idle_polls <= policy.spin_polls) return {Pause::spin};
  if (idle_polls <= policy.spin_polls + policy.yield_polls) return {Pause::yield};
  const std::int64_t sleeps = idle_polls - policy.spin_polls - policy.yield_polls;  // 1, 2, ...
  const std::int64_t cap = std::max(policy.sleep_us, policy.sleep_max_us);
  std::int64_t us = policy.sleep_us;
  for (std::int64_t i = 1; i < sleeps && us < cap; ++i) us = us ? 2 * us : 1;
  return {Pause::sleep, std::min(us, cap)};
}

}  // namespace moed::comm
