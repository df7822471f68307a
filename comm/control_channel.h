// The control plane's collectives over MPI: rank 0 (the coordinator)
// broadcasts each step's command and gathers figures and outputs. Every wait
// has the [comm].timeout_ms deadline; on expiry the error says which
// collective was waiting, instead of the job hanging.
#pragma once

#include <mpi.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "comm/mpi/mpi_session.h"

namespace moed::comm {

class ControlChannel {
 public:
  ControlChannel(MPI_Comm comm, std::chrono::milliseconds timeout);
  ControlChannel(const ControlChannel&) = delete;
  ControlChannel& operator=(const ControlChannel&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  // Called while waiting, so that the data transport keeps progressing.
  void set_progress(std::function<void()> progress) { progress_ = std::move(progress); }

  void broadcast(void* data, std::size_t bytes, const std::string& what);  // from rank 0
  void reduce_max(double* values, std::size_t n, const std::string& what);  // into rank 0
  void reduce_sum(std::uint64_t* values, std::size_t n, const std::string& what);
  void reduce_sum(double* values, std::size_t n, const std::string& what);
  int all_max(int value, const std::string& what);
  // Every rank's bytes in rank order on rank 0 (empty elsewhere).
  std::vector<std::byte> gather(const void* data, std::size_t bytes, const std::string& what);
  // The same when every rank sends the same number of bytes: one collective, not two.
  std::vector<std::byte> gather_equal(const void* data, std::size_t bytes, const std::string& what);
  // Rank 0's text on every rank. One collective when it fits in a small
  // block (the usual case: nothing, or a few control actions), two otherwise.
  void broadcast_text(std::string& text, const std::string& what);
  // Every rank's string, in rank order, on every rank.
  std::vector<std::string> all_gather_strings(const std::string& mine, const std::string& what);

 private:
  void wait(MPI_Request& request, const std::string& what);

  DupComm comm_;
  int rank_ = 0, size_ = 1;
  std::chrono::milliseconds timeout_;
  std::function<void()> progress_;
};

}  // namespace moed::comm
