// The [comm] config section: which Transport backend carries token traffic.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "common/config_table.h"

namespace moed::comm {

// [comm].backend: auto, then the transport backends in transport.cc's table
// order (a unit test holds the two lists equal; this file must not link them).
enum class Backend { automatic, nccl, ucx, mpi };
inline constexpr auto kBackendNames = config::name_table<Backend>(
    {{Backend::automatic, "auto"}, {Backend::nccl, "nccl"}, {Backend::ucx, "ucx"}, {Backend::mpi, "mpi"}});
inline std::string_view name_of(Backend v) { return kBackendNames.name(v); }

// [comm].control: what the control collectives run over once the transport
// is up (start-up always uses MPI): comm/control_channel.h.
enum class ControlMedium { mpi, transport };
inline constexpr auto kControlMediumNames =
    config::name_table<ControlMedium>({{ControlMedium::mpi, "mpi"}, {ControlMedium::transport, "transport"}});
inline std::string_view name_of(ControlMedium v) { return kControlMediumNames.name(v); }

struct CommConfig {
  Backend backend = Backend::automatic;
  ControlMedium control = ControlMedium::mpi;
  std::int64_t timeout_ms = 0;
  std::int64_t nccl_lanes = 0;
  bool hierarchical = true;
  bool narrow_answers = true;
  bool detect_lost_peers = false;
  bool elastic = false;
  std::int64_t spares = 0;
  std::int64_t join_slots = 0;
  std::int64_t lease_ms = 0;
  std::string join_listen;
  // Not a key: the CUDA device the rank's experts run on (-1: the CPU), set
  // by the daemon from [experts].device; the NCCL transport runs there.
  int device = -1;
  std::int64_t wait_spin_polls = 32, wait_yield_polls = 2048, wait_sleep_us = 20, wait_sleep_max_us = 1000;
};

const config::Section<CommConfig>& comm_config_section();

}  // namespace moed::comm
