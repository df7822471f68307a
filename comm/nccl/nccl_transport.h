// The NCCL backend of Transport: each exchange is one group of ncclSend and
// ncclRecv (NcclGroups, nccl_groups.h), launched once the exchange knows
// every block it sends. So a sender calls send() once for every other rank,
// 0 bytes included, as Exchange::send says. Where the receiver knows only a
// capacity (ReceiveSizes::at_most), a first group carries each block's size,
// since NCCL's sends and receives must agree on their counts.
//
// Exchanges take the lanes (communicators) in turn, in the order they are
// opened, which every rank shares. On one lane, groups launch in that order
// too, so that the n-th exchange of one rank meets the n-th of every other;
// an exchange whose sends are all known waits for the earlier ones of its
// lane to launch. With at least as many lanes as a step has exchanges open
// at once ([comm].nccl_lanes), none waits.
//
// Not elastic (a lost rank ends the job, as with MPI). NCCL has no one-sided
// writes, so live migration's windows go over a host transport made beside
// it (UCX, else MPI), where the expert store keeps its slots.
#pragma once

#include <chrono>
#include <memory>
#include <optional>
#include <string>

#include "comm/nccl/nccl_groups.h"
#include "comm/transport.h"

namespace moed::comm {

// Over `groups` (this rank's lanes), as rank `rank` of `size`. `windows`
// carries create_window() and progress() (nullptr: create_window is refused).
std::unique_ptr<Transport> create_nccl_transport_over(int rank, int size, std::chrono::milliseconds timeout,
                                                      std::unique_ptr<NcclGroups> groups,
                                                      std::unique_ptr<Transport> windows);

// Whether this build has the CUDA side of the NCCL transport (nvcc found).
bool nccl_transport_built();

// Collective over `bootstrap`: [comm].nccl_lanes communicators on the local
// rank's GPU, and a host transport for windows. Only where
// nccl_transport_built(); the table's probe says why not elsewhere.
std::unique_ptr<Transport> create_nccl_transport(const CommConfig& config, Bootstrap& bootstrap);

}  // namespace moed::comm
