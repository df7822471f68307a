// The GPU a rank uses: one rule for the start-up log line (describe_binding),
// the job's islands, the NUMA binding and `moed --print-topology`, the same
// rule launch/moed-rank follows in shell.
#pragma once

#include <optional>
#include <string>

namespace moed::launch {

struct RankGpu {
  int device = -1;  // the CUDA device index; -1 when the process sees no GPU
  // The physical GPU: entry `device` of CUDA_VISIBLE_DEVICES when it is set, as
  // the launcher wrote it (an index in PCI order, a UUID or a MIG name), "" when
  // the variable has fewer entries; the device's own number when it is unset.
  // "" when there is no device.
  std::string physical;
};

// Ranks are packed per host, one per GPU: local rank r uses device
// (r mod visible_gpus), sharing round robin when there are more ranks than
// GPUs. CUDA numbers the visible devices 0.. in the order CUDA_VISIBLE_DEVICES
// lists them, which names the physical GPU. A negative local rank counts as 0.
RankGpu gpu_of_rank(int local_rank, int visible_gpus, const std::optional<std::string>& cuda_visible_devices);

// How many GPUs a process sees on a host of `host_gpus` GPUs, for callers that
// have no CUDA device count: one per entry of CUDA_VISIBLE_DEVICES when it is
// set ("" hides every GPU), else all of the host's.
int visible_gpu_count(int host_gpus, const std::optional<std::string>& cuda_visible_devices);

}  // namespace moed::launch
