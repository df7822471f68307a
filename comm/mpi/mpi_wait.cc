#include "comm/mpi/mpi_wait.h"

#include <climits>

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

void wait_collective(MPI_Request& request, MPI_Comm comm, std::chrono::milliseconds timeout,
                     const std::function<void()>& progress, const std::string& what) {
  std::vector<MPI_Request> one{request};
  wait_all_until(one, std::chrono::steady_clock::now() + timeout, progress, [&](const auto&) {
    int rank = 0, size = 1;
    MPI_Comm_rank(comm, &rank);
    MPI_Comm_size(comm, &size);
    MOED_THROW(Runtime,
               "rank {}: {}: deadline of {} ms expired in a collective over all {} ranks; a rank "
               "is stuck or gone ([comm].timeout_ms)",
               rank, what, timeout.count(), size);
  });
  request = one[0];
}

std::vector<std::vector<std::byte>> all_gather_varying(MPI_Comm comm, std::span<const std::byte> mine,
                                                       const std::string& what,
                                                       const std::function<void(MPI_Request&)>& wait) {
  int size = 1;
  MPI_Comm_size(comm, &size);
  if (mine.size() > std::size_t(INT_MAX)) MOED_THROW(Runtime, "{}: {} bytes exceed MPI's int count", what, mine.size());
  int length = int(mine.size());
  std::vector<int> lengths(size), offsets(size);
  MPI_Request request;
  check_mpi(MPI_Iallgather(&length, 1, MPI_INT, lengths.data(), 1, MPI_INT, comm, &request), "MPI_Iallgather");
  wait(request);
  long long total = 0;
  for (int r = 0; r < size; ++r) offsets[r] = int(total), total += lengths[r];
  if (total > INT_MAX) MOED_THROW(Runtime, "{}: {} bytes exceed MPI's int count", what, total);
  std::vector<std::byte> all(static_cast<std::size_t>(total));
  check_mpi(MPI_Iallgatherv(mine.data(), length, MPI_BYTE, all.data(), lengths.data(), offsets.data(), MPI_BYTE,
                            comm, &request),
            "MPI_Iallgatherv");
  wait(request);
  std::vector<std::vector<std::byte>> out;
  for (int r = 0; r < size; ++r) out.emplace_back(all.begin() + offsets[r], all.begin() + offsets[r] + lengths[r]);
  return out;
}

}  // namespace moed::comm
