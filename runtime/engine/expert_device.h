// Which device a rank's experts run on ([experts].device): what this process
// can offer (probe_gpus, the only part that touches CUDA) and the choice
// made from it (choose_expert_device, pure). The daemon makes the choice on
// every rank at start-up; under "auto" the job then takes the GPU only if
// every rank can, so that all ranks compute alike.
#pragma once

#include <string>
#include <string_view>

#include "common/available_memory.h"
#include "kernels/cpu/bf16_dot_gemm.h"
#include "runtime/engine/expert_executor.h"

namespace moed::runtime {

// What this process can offer the experts.
struct GpuFacts {
  bool kernels_built = false;   // this build has kernels/cuda (nvcc was found at build time)
  bool executor_built = false;  // this build can run experts on a GPU (a CUDA ExpertExecutor)
  bool gpu_usable = false;      // a device is visible and runs kernels/cuda's code
  int gpus = 0;                 // devices this process sees (when gpu_usable)
  std::string why_no_gpu;       // when !gpu_usable: the driver's or the probe's reason
};

// This process's facts: kernels/cuda's device probe (gpu_available), where
// the build has it. Never throws; without a driver it says so.
GpuFacts probe_gpus();

// The free memory of CUDA device `gpu`, for the start-up memory check; a
// Runtime error naming the cause when it cannot be read.
AvailableMemory gpu_free_memory(int gpu);

struct DeviceChoice {
  ExpertDevice device = ExpertDevice::cpu;
  int gpu = 0;      // under cuda: the CUDA device index (the caller sets it: launch/rank_gpu.h)
  std::string why;  // for the start-up log: "[experts].device = auto: cpu, as ..."
};

// [experts].device ("auto", "cpu" or "cuda") on a process with `facts`:
// "cuda" is a Usage error naming the first missing piece (the build's
// kernels, a usable GPU, the executor); "auto" takes cuda where nothing is
// missing, else cpu, saying why.
DeviceChoice choose_expert_device(std::string_view requested, const GpuFacts& facts);

// The products compact experts take on a GPU ([experts].products under
// device = cuda): "auto" and "f32" the CPU's fp32 chains, "bf16" bf16
// products on the tensor cores; anything else a Usage error naming the
// choices.
kernels::CompactProducts gpu_products(std::string_view requested);

}  // namespace moed::runtime
