#include "runtime/engine/expert_executor.h"

#include "common/error.h"
#include "runtime/engine/cpu_expert_executor.h"
#if defined(MOED_HAVE_CUDA)
#include "runtime/engine/cuda_expert_executor.h"
#endif

namespace moed::runtime {

std::string_view to_string(ExpertDevice device) {
  switch (device) {
    case ExpertDevice::cpu:
      return "cpu";
    case ExpertDevice::cuda:
      return "cuda";
  }
  return "?";
}

std::unique_ptr<ExpertExecutor> make_expert_executor(ExpertDevice device, std::size_t block_rows, int gpu) {
  if (device == ExpertDevice::cpu) return std::make_unique<CpuExpertExecutor>(block_rows);
#if defined(MOED_HAVE_CUDA)
  return std::make_unique<CudaExpertExecutor>(gpu, block_rows);
#else
  static_cast<void>(gpu);
  MOED_THROW(Usage, "no {} expert executor in this build: experts run on the CPU ([experts].device = cpu)",
             to_string(device));
#endif
}

}  // namespace moed::runtime
