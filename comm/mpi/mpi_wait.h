// Waiting on MPI requests without hanging silently: poll until done, yield
// the core while idle (ranks may share cores), and past the deadline hand the
// still-pending requests to a callback that explains and throws.
#pragma once

#include <mpi.h>

#include <chrono>
#include <functional>
#include <vector>

namespace moed::comm {

using Deadline = std::chrono::steady_clock::time_point;

// `progress`, when set, is called on every idle poll (another transport's
// progress, e.g. UCX's worker).
void wait_all_until(std::vector<MPI_Request>& requests, Deadline deadline,
                    const std::function<void()>& progress,
                    const std::function<void(const std::vector<std::size_t>& pending)>& on_expiry);

}  // namespace moed::comm
