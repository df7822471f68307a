// The control channel's collectives over MPI (comm/control_channel.h): each
// a nonblocking MPI collective on a duplicate of the communicator, waited
// for under the deadline. What start-up runs over, and the whole run with
// [comm].control = "mpi".
#pragma once

#include <mpi.h>

#include <chrono>
#include <memory>

#include "comm/control_channel.h"

namespace moed::comm {

std::unique_ptr<ControlLink> mpi_control_link(MPI_Comm comm, std::chrono::milliseconds timeout);

}  // namespace moed::comm
