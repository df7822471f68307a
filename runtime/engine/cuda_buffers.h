// Device buffers the engine's CUDA parts share (built where the CUDA kernels are).
#pragma once

#include <cstddef>

#include "kernels/cuda/cuda_kernels.h"

namespace moed::runtime {

// `n` floats of `host` on the device (none when host is null).
inline cuda::DeviceBuffer<float> floats_on_device(const float* host, std::size_t n) {
  cuda::DeviceBuffer<float> d(host ? n : 0);
  if (host) d.upload(host, n);
  return d;
}

// Grown, never shrunk, as RowBlockExecutor::at_least: bounded by the largest
// request, so nothing grows with steps.
template <class T>
T* device_at_least(cuda::DeviceBuffer<T>& buffer, std::size_t n) {
  if (buffer.size() < n) buffer = cuda::DeviceBuffer<T>(n);
  return buffer.data();
}

}  // namespace moed::runtime
