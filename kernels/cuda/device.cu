// Errors and the stream of cuda_kernels.h (device detection: gpu_probe.cu; cuBLAS: cublas.cu).
#include "kernels/cuda/cuda_kernels.h"

namespace moed::cuda {

CudaError::CudaError(const char* file, int line, const std::string& message)
    : std::runtime_error(std::string(file) + ":" + std::to_string(line) + ": " + message),
      file_(file),
      line_(line) {}

namespace detail {

void throw_cuda(cudaError_t status, const char* expr, const char* file, int line) {
  throw CudaError(file, line,
                  std::string(expr) + " failed: " + cudaGetErrorName(status) + " (" +
                      cudaGetErrorString(status) + ")");
}

}  // namespace detail

Stream::Stream() { MOED_CUDA_CHECK(cudaStreamCreate(&s_)); }

Stream::~Stream() {
  if (s_) cudaStreamDestroy(s_);
}

Stream& Stream::operator=(Stream&& o) noexcept {
  if (this != &o) {
    if (s_) cudaStreamDestroy(s_);
    s_ = std::exchange(o.s_, nullptr);
  }
  return *this;
}

void Stream::synchronize() const { MOED_CUDA_CHECK(cudaStreamSynchronize(s_)); }

}  // namespace moed::cuda
