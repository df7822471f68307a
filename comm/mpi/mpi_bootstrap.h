// The Bootstrap over MPI: a duplicate of the job's communicator, whose
// non-blocking collectives are waited on under the deadline (mpi_wait.h), so
// that a rank stuck or gone ends the wait with a diagnostic. A backend that
// works over MPI itself (the MPI transport) takes the communicator from here
// (mpi_communicator), not through the transport's interface.
#pragma once

#include <mpi.h>

#include <chrono>
#include <string>

#include "comm/bootstrap.h"
#include "comm/mpi/mpi_session.h"

namespace moed::comm {

class MpiBootstrap final : public Bootstrap {
 public:
  // Collective over `comm`, which it duplicates.
  MpiBootstrap(MPI_Comm comm, std::chrono::milliseconds timeout);

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::chrono::milliseconds timeout() const override { return timeout_; }
  std::vector<std::vector<std::byte>> all_gather(std::span<const std::byte> mine, const std::string& what) override;
  void all_reduce(std::span<std::int64_t> values, Reduction reduction, const std::string& what) override;
  void barrier(const std::string& what, const Progress& progress) override;

  MPI_Comm communicator() const { return comm_.get(); }

 private:
  DupComm comm_;
  int rank_ = 0, size_ = 1;
  std::chrono::milliseconds timeout_;
};

// The communicator under `bootstrap`, for the backend named `backend`; a
// Usage error when `bootstrap` is not an MpiBootstrap.
MPI_Comm mpi_communicator(const Bootstrap& bootstrap, const char* backend);

}  // namespace moed::comm
