#include "comm/idle_backoff.h"

namespace moed::comm {

namespace {
WaitPolicy g_policy;
}

void set_wait_policy(const WaitPolicy& policy) { g_policy = policy; }

const WaitPolicy& wait_policy() { return g_policy; }

}  // namespace moed::comm
