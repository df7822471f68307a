#include "comm/mpi/mpi_bootstrap.h"

#include "comm/mpi/mpi_session.h"
#include "comm/mpi/mpi_wait.h"
#include "common/error.h"

namespace moed::comm {

MpiBootstrap::MpiBootstrap(MPI_Comm comm, std::chrono::milliseconds timeout) : comm_(comm), timeout_(timeout) {
  MPI_Comm_rank(comm_.get(), &rank_);
  MPI_Comm_size(comm_.get(), &size_);
}

std::vector<std::vector<std::byte>> MpiBootstrap::all_gather(std::span<const std::byte> mine,
                                                             const std::string& what) {
  return all_gather_varying(comm_.get(), mine, what,
                            [&](MPI_Request& request) { wait_collective(request, comm_.get(), timeout_, {}, what); });
}

void MpiBootstrap::all_reduce(std::span<std::int64_t> values, Reduction reduction, const std::string& what) {
  MPI_Request request;
  check_mpi(MPI_Iallreduce(MPI_IN_PLACE, values.data(), int(values.size()), MPI_INT64_T,
                           reduction == Reduction::max ? MPI_MAX : MPI_SUM, comm_.get(), &request),
            "MPI_Iallreduce");
  wait_collective(request, comm_.get(), timeout_, {}, what);
}

void MpiBootstrap::barrier(const std::string& what, const Progress& progress) {
  MPI_Request request;
  check_mpi(MPI_Ibarrier(comm_.get(), &request), "MPI_Ibarrier");
  wait_collective(request, comm_.get(), timeout_, progress, what);
}

MPI_Comm mpi_communicator(const Bootstrap& bootstrap, const char* backend) {
  const auto* mpi = dynamic_cast<const MpiBootstrap*>(&bootstrap);
  if (!mpi) MOED_THROW(Usage, "the {} transport runs only over MPI (an MPI bootstrap)", backend);
  return mpi->communicator();
}

}  // namespace moed::comm
