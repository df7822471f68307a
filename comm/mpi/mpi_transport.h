// The MPI backend of Transport: point-to-point Isend/Irecv with every peer
// (what Open MPI's alltoallv does at these sizes) so that a wait past the
// deadline can name the peers that have not delivered.
#pragma once

#include <memory>

#include "comm/transport.h"

namespace moed::comm {

std::unique_ptr<Transport> create_mpi_transport(const CommConfig& config, MPI_Comm comm);

}  // namespace moed::comm
