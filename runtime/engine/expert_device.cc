#include "runtime/engine/expert_device.h"

#include <optional>

#include <fmt/format.h>

#include "common/error.h"
#if defined(MOED_HAVE_CUDA)
#include "kernels/cuda/gpu_probe.h"
#endif

namespace moed::runtime {

GpuFacts probe_gpus() {
  GpuFacts facts;
#if defined(MOED_HAVE_CUDA)
  facts.kernels_built = true;
  facts.executor_built = true;  // cuda_expert_executor.h
  facts.gpu_usable = cuda::gpu_available(&facts.why_no_gpu, &facts.gpus);
#else
  facts.why_no_gpu = "this build has no CUDA kernels";
#endif
  return facts;
}

AvailableMemory gpu_free_memory(int gpu) {
#if defined(MOED_HAVE_CUDA)
  std::uint64_t free = 0, total = 0;
  std::string why;
  if (!cuda::gpu_memory(gpu, &free, &total, &why)) MOED_THROW(Runtime, "GPU {}: {}", gpu, why);
  return {free, fmt::format("free on GPU {} of {}, cudaMemGetInfo", gpu, human_bytes(total))};
#else
  MOED_THROW(Internal, "GPU {}: this build has no CUDA kernels", gpu);
#endif
}

namespace {

// What keeps experts off the GPU in a process with `facts`, or nullopt.
std::optional<std::string> missing_for_cuda(const GpuFacts& facts) {
  if (!facts.kernels_built)
    return "this build has no CUDA kernels (nvcc was not found when it was configured, or MOED_CUDA=OFF)";
  if (!facts.gpu_usable) return "no usable GPU: " + facts.why_no_gpu;
  if (!facts.executor_built) return "this build runs experts on the CPU only (it has no CUDA expert executor)";
  return std::nullopt;
}

}  // namespace

DeviceChoice choose_expert_device(std::string_view requested, const GpuFacts& facts) {
  const std::optional<std::string> missing = missing_for_cuda(facts);
  if (requested == "cpu") return {ExpertDevice::cpu, 0, "[experts].device = cpu"};
  if (requested == "cuda") {
    if (missing) MOED_THROW(Usage, "[experts].device = \"cuda\" cannot run here: {}", *missing);
    return {ExpertDevice::cuda, 0, "[experts].device = cuda"};
  }
  if (requested == "auto") {
    if (missing) return {ExpertDevice::cpu, 0, "[experts].device = auto: cpu, as " + *missing};
    return {ExpertDevice::cuda, 0, "[experts].device = auto: cuda, as this process has a usable GPU"};
  }
  MOED_THROW(Usage, "[experts].device = \"{}\" is not one of auto, cpu, cuda", requested);
}

kernels::CompactProducts gpu_products(std::string_view requested) {
  if (requested == "auto" || requested == "f32") return kernels::CompactProducts::f32;
  if (requested == "bf16") return kernels::CompactProducts::bf16;
  MOED_THROW(Usage, "[experts].device = cuda multiplies compact experts with fp32 products, or bf16 on the tensor "
             "cores; [experts].products = \"{}\" has no GPU form (use auto, f32 or bf16)", requested);
}

}  // namespace moed::runtime
