// The device probe of gpu_probe.h.
#include "kernels/cuda/gpu_probe.h"

#include <cuda_runtime_api.h>

namespace moed::cuda {

namespace {

// Never launched: asking for its attributes loads the module, which fails when
// the binary holds no code the device can run (e.g. built for sm_90 only).
__global__ void probe_kernel() {}

std::string describe(const char* call, cudaError_t status) {
  return std::string(call) + ": " + cudaGetErrorName(status) + " (" + cudaGetErrorString(status) + ")";
}

}  // namespace

bool gpu_available(std::string* why, int* devices) {
  try {
    auto fail = [&](const std::string& reason) {
      cudaGetLastError();  // clear the error so later checks do not see it
      if (why) *why = reason;
      return false;
    };
    int count = 0;
    if (devices) *devices = 0;
    if (cudaError_t s = cudaGetDeviceCount(&count); s != cudaSuccess)
      return fail(describe("cudaGetDeviceCount", s));
    if (count == 0) return fail("cudaGetDeviceCount: no CUDA device");
    cudaFuncAttributes attr{};
    if (cudaError_t s = cudaFuncGetAttributes(&attr, probe_kernel); s != cudaSuccess)
      return fail(describe("loading the moed kernels on the device", s));
    if (why) why->clear();
    if (devices) *devices = count;
    return true;
  } catch (...) {  // only std::string allocation can throw here
    return false;
  }
}

bool gpu_memory(int device, std::uint64_t* free_bytes, std::uint64_t* total_bytes, std::string* why) {
  try {
    std::size_t free = 0, total = 0;
    cudaError_t s = cudaSetDevice(device);
    if (s == cudaSuccess) s = cudaMemGetInfo(&free, &total);
    if (s != cudaSuccess) {
      cudaGetLastError();
      if (why) *why = describe("cudaMemGetInfo", s);
      return false;
    }
    *free_bytes = free;
    *total_bytes = total;
    return true;
  } catch (...) {  // only std::string allocation can throw here
    return false;
  }
}

}  // namespace moed::cuda
