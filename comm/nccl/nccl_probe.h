// The NCCL backend's "can I connect" probe. NCCL carries rows that live in
// GPU memory, so it can run only where a GPU and NCCL are present and the
// experts run on the GPU. The probe loads the CUDA driver (libcuda.so.1) and
// NCCL (libnccl.so.2) at run time, so that moed links neither and starts on
// hosts without them; what they report is plain data (NcclFacts), and the
// verdict a pure function of it.
#pragma once

#include <optional>
#include <string>

namespace moed::comm {

class Bootstrap;

struct NcclFacts {
  std::string no_gpu;      // why the CUDA driver shows no device ("" when it shows some)
  int gpus = 0;            // devices the driver shows
  std::string no_library;  // why NCCL cannot be loaded ("" when it can)
  int nccl_version = 0;    // ncclGetVersion's, e.g. 22703 for 2.27.3
  bool transport_built = false;  // this build can move rows through NCCL
};

// This process's facts. Never throws.
NcclFacts probe_nccl();

// Why the NCCL backend cannot run with `facts`, naming the first missing
// piece (a GPU, the library, the transport itself), or nullopt.
std::optional<std::string> nccl_unavailable_with(const NcclFacts& facts);

// The transport table's probe: nccl_unavailable_with(probe_nccl()).
std::optional<std::string> nccl_unavailable(const Bootstrap& bootstrap);

// "2.27.3" for 22703 (NCCL >= 2.9's encoding: major*10000 + minor*100 + patch).
std::string nccl_version_string(int code);

}  // namespace moed::comm
