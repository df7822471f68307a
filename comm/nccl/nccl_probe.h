// The NCCL backend's "can I connect" probe. NCCL carries rows through the
// GPU, so it can run only where a GPU and NCCL are present, the build has the
// transport's CUDA side, and the experts run on the GPU. The probe loads the
// CUDA driver (libcuda.so.1) and
// NCCL (libnccl.so.2) at run time, so that moed links neither and starts on
// hosts without them; what they report is plain data (NcclFacts), and the
// verdict a pure function of it.
#pragma once

#include <optional>
#include <string>

#include "comm/comm_config.h"

namespace moed::comm {

class Bootstrap;

// The oldest NCCL the transport takes: non-blocking communicators
// (ncclCommInitRankConfig with blocking = 0), so that no call waits for a peer.
inline constexpr int kOldestNccl = 21400;

struct NcclFacts {
  std::string no_gpu;      // why the CUDA driver shows no device ("" when it shows some)
  int gpus = 0;            // devices the driver shows
  std::string no_library;  // why NCCL cannot be loaded ("" when it can)
  int nccl_version = 0;    // ncclGetVersion's, e.g. 22703 for 2.27.3
  bool transport_built = false;  // this build has the transport's CUDA side (nccl_transport.h)
  bool experts_on_gpu = false;   // [experts].device put this rank's experts on a GPU
};

// This process's facts, with `config`'s device. Never throws.
NcclFacts probe_nccl(const CommConfig& config);

// Why the NCCL backend cannot run with `facts`, naming the first missing
// piece (a GPU, the library, the transport itself), or nullopt.
std::optional<std::string> nccl_unavailable_with(const NcclFacts& facts);

// The transport table's probe: nccl_unavailable_with(probe_nccl(config)).
std::optional<std::string> nccl_unavailable(const CommConfig& config, const Bootstrap& bootstrap);

// "2.27.3" for 22703 (NCCL >= 2.9's encoding: major*10000 + minor*100 + patch).
std::string nccl_version_string(int code);

}  // namespace moed::comm
