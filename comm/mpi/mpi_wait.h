// Waiting on MPI requests without hanging silently: poll until done, yield
// the core while idle (ranks may share cores), and past the deadline hand the
// still-pending requests to a callback that explains and throws.
#pragma once

#include <mpi.h>

#include <chrono>
#include <cstddef>
#include <functional>
#include <span>
#include <string>
#include <vector>

namespace moed::comm {

using Deadline = std::chrono::steady_clock::time_point;

// `progress`, when set, is called on every idle poll (another transport's
// progress, e.g. UCX's worker).
void wait_all_until(std::vector<MPI_Request>& requests, Deadline deadline,
                    const std::function<void()>& progress,
                    const std::function<void(const std::vector<std::size_t>& pending)>& on_expiry);

// Waits for one collective over `comm` for at most `timeout`; past it throws
// a Runtime error naming `what` and saying that a rank is stuck or gone.
void wait_collective(MPI_Request& request, MPI_Comm comm, std::chrono::milliseconds timeout,
                     const std::function<void()>& progress, const std::string& what);

// Every rank's bytes (their lengths may differ) in rank order: the lengths
// first, then the bytes, each collective waited on by `wait`.
std::vector<std::vector<std::byte>> all_gather_varying(MPI_Comm comm, std::span<const std::byte> mine,
                                                       const std::string& what,
                                                       const std::function<void(MPI_Request&)>& wait);

}  // namespace moed::comm
