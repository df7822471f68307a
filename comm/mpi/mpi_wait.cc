#include "comm/mpi/mpi_wait.h"

#include "comm/idle_backoff.h"
#include "comm/mpi/mpi_session.h"
#include "common/error.h"

namespace moed::comm {

void wait_all_until(std::vector<MPI_Request>& requests, Deadline deadline,
                    const std::function<void()>& progress,
                    const std::function<void(const std::vector<std::size_t>&)>& on_expiry) {
  IdleBackoff backoff;
  for (;;) {
    int done = 0;
    check_mpi(MPI_Testall(int(requests.size()), requests.data(), &done, MPI_STATUSES_IGNORE),
              "MPI_Testall");
    if (done) return;
    if (progress) progress();
    backoff.idle();
    if (std::chrono::steady_clock::now() > deadline) {
      std::vector<std::size_t> pending;
      for (std::size_t i = 0; i < requests.size(); ++i) {
        int flag = 0;
        MPI_Test(&requests[i], &flag, MPI_STATUS_IGNORE);
        if (!flag) pending.push_back(i);
      }
      on_expiry(pending);
      MOED_THROW(Internal, "deadline callback returned instead of throwing");
    }
  }
}

}  // namespace moed::comm
