// The Bootstrap: the few collectives a transport needs besides its data path,
// to set itself up (exchange worker addresses, agree that every rank got
// through a step) and to tear down (wait for every rank before closing).
// MpiBootstrap (comm/mpi/mpi_bootstrap.h) runs them over the job's MPI
// communicator; ThreadBootstrap (comm/thread_bootstrap.h) over the threads of
// one process, so that a backend connects and is tested without MPI.
//
// Every call is collective: all ranks make the same calls in the same order.
// Each waits under a deadline ([comm].timeout_ms); on expiry it throws a
// Runtime error that names `what`.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

namespace moed::comm {

class Bootstrap {
 public:
  enum class Reduction { max, sum };
  // Called on every idle poll of a wait: a transport whose peers need this
  // rank to keep moving meanwhile (UCX's worker, for their puts and closes)
  // passes its progress.
  using Progress = std::function<void()>;

  virtual ~Bootstrap() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual std::chrono::milliseconds timeout() const = 0;

  // Every rank's bytes, in rank order; their lengths may differ.
  virtual std::vector<std::vector<std::byte>> all_gather(std::span<const std::byte> mine,
                                                         const std::string& what) = 0;
  // values[i] becomes the reduction of every rank's values[i] (every rank
  // passes as many).
  virtual void all_reduce(std::span<std::int64_t> values, Reduction reduction, const std::string& what) = 0;
  // Returns once every rank has come.
  virtual void barrier(const std::string& what, const Progress& progress) = 0;

  // The largest of every rank's value.
  std::int64_t all_max(std::int64_t value, const std::string& what) {
    all_reduce(std::span(&value, 1), Reduction::max, what);
    return value;
  }
};

}  // namespace moed::comm
