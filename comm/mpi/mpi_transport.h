// The MPI backend of Transport: point-to-point Isend/Irecv with every peer
// (what Open MPI's alltoallv does at these sizes) so that a wait past the
// deadline can name the peers that have not delivered.
#pragma once

#include <memory>
#include <optional>
#include <string>

#include "comm/transport.h"

namespace moed::comm {

// Over the communicator of an MPI bootstrap (comm/mpi/mpi_bootstrap.h), which
// it duplicates.
std::unique_ptr<Transport> create_mpi_transport(const CommConfig& config, Bootstrap& bootstrap);

// Why not: the bootstrap is not over MPI (nullopt when it is).
std::optional<std::string> mpi_unavailable(const CommConfig& config, const Bootstrap& bootstrap);

}  // namespace moed::comm
