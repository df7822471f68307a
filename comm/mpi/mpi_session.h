// RAII for MPI: initialisation and finalisation, duplicated communicators,
// and error checking that names the call that failed.
#pragma once

#include <mpi.h>

#include <string>

namespace moed::comm {

// Throws a Runtime error "what: MPI error text" unless rc is MPI_SUCCESS.
void check_mpi(int rc, const char* what);

// A duplicate of a communicator (MPI_Comm_dup, collective), freed on release
// unless MPI is already finalised.
class DupComm {
 public:
  explicit DupComm(MPI_Comm comm);
  ~DupComm();
  DupComm(const DupComm&) = delete;
  DupComm& operator=(const DupComm&) = delete;
  MPI_Comm get() const { return comm_; }

 private:
  MPI_Comm comm_ = MPI_COMM_NULL;
};

class MpiSession {
 public:
  MpiSession(int* argc, char*** argv);  // MPI_Init_thread (FUNNELED), errors returned, not fatal
  ~MpiSession();                         // MPI_Finalize, unless aborted
  MpiSession(const MpiSession&) = delete;
  MpiSession& operator=(const MpiSession&) = delete;

  MPI_Comm world() const { return MPI_COMM_WORLD; }
  int rank() const { return rank_; }
  int size() const { return size_; }
  std::string processor_name() const;
  // Ends every rank of the job now (the process does not return).
  [[noreturn]] void abort(int code);

 private:
  int rank_ = 0, size_ = 1;
};

}  // namespace moed::comm
