// The ranks of a job as threads of the test: run_ranks(n, body) calls
// body(bootstrap) on n threads at once, each with its own ThreadBootstrap
// over one rendezvous, and rethrows the first rank's error once all ended.
#pragma once

#include <chrono>
#include <exception>
#include <functional>
#include <thread>
#include <vector>

#include "comm/thread_bootstrap.h"

namespace moed::test {

inline void run_ranks(int ranks, const std::function<void(comm::ThreadBootstrap&)>& body,
                      std::chrono::milliseconds timeout = std::chrono::seconds(10)) {
  comm::ThreadRendezvous rendezvous(ranks, timeout);
  std::vector<std::exception_ptr> errors(static_cast<std::size_t>(ranks));
  std::vector<std::thread> threads;
  for (int r = 0; r < ranks; ++r)
    threads.emplace_back([&, r] {
      comm::ThreadBootstrap bootstrap(rendezvous, r);
      try {
        body(bootstrap);
      } catch (...) {
        errors[std::size_t(r)] = std::current_exception();
      }
    });
  for (auto& t : threads) t.join();
  for (const auto& e : errors)
    if (e) std::rethrow_exception(e);
}

}  // namespace moed::test
