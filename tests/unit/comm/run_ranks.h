// The ranks of a job as threads of the test: run_ranks(n, body) calls
// body(bootstrap) on n threads at once, each with its own ThreadBootstrap
// over one rendezvous, and once all ended rethrows the first rank's error
// (printing the other ranks' errors).
#pragma once

#include <chrono>
#include <exception>
#include <functional>
#include <iostream>
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
  // The first rank's error is rethrown as it is (tests check its kind);
  // the others' are printed, so that the first is not mistaken for the cause.
  std::exception_ptr first;
  for (std::size_t r = 0; r < errors.size(); ++r) {
    if (!errors[r]) continue;
    if (!first) {
      first = errors[r];
      continue;
    }
    try {
      std::rethrow_exception(errors[r]);
    } catch (const std::exception& e) {
      std::cerr << "run_ranks: rank " << r << " failed too: " << e.what() << "\n";
    } catch (...) {
      std::cerr << "run_ranks: rank " << r << " failed too, with an exception that is not a std::exception\n";
    }
  }
  if (first) std::rethrow_exception(first);
}

}  // namespace moed::test
