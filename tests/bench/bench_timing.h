// Timing what the benchmarks share.
#pragma once

#include <chrono>

namespace moed::bench {

inline double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// Seconds per call of `call`, calling it until `budget` seconds have passed (at least once).
template <class F>
double seconds_per_call(F&& call, double budget) {
  const auto start = std::chrono::steady_clock::now();
  int calls = 0;
  double elapsed = 0;
  do {
    call();
    ++calls;
    elapsed = seconds_since(start);
  } while (elapsed < budget);
  return elapsed / calls;
}

}  // namespace moed::bench
