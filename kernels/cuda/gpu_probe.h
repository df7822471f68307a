// Whether this process can run moed's CUDA kernels: apart from the kernels
// (no CUDA or cuBLAS header; in moed_cuda_core, on the static CUDA runtime),
// so that the daemon can ask on any host, with or without a driver, and its
// binary depends on no CUDA library.
#pragma once

#include <cstdint>
#include <string>

namespace moed::cuda {

// True when a device is present, usable, and can run code built like this
// library's kernels. Any failure (no driver, driver too old, no device, no
// kernel image for the device's architecture) returns false with the reason
// in *why (may be null). *devices (unless null) receives how many devices
// this process sees (0 when false). Never throws.
bool gpu_available(std::string* why, int* devices = nullptr);

// The free and total memory of CUDA device `device` (cudaMemGetInfo, which
// makes the device's context), or false with the reason in *why. Never throws.
bool gpu_memory(int device, std::uint64_t* free_bytes, std::uint64_t* total_bytes, std::string* why);

}  // namespace moed::cuda
