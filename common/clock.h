// Monotonic time in seconds, for phase timings and deadlines.
#pragma once

#include <chrono>

namespace moed {

inline double now_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

}  // namespace moed
