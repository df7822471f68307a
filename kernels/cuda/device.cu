// Errors and the RAII wrappers of cuda_kernels.h (device detection: gpu_probe.cu).
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

void throw_cublas(cublasStatus_t status, const char* expr, const char* file, int line) {
  throw CudaError(file, line,
                  std::string(expr) + " failed: " + cublasGetStatusName(status) + " (" +
                      cublasGetStatusString(status) + ")");
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

CublasHandle::CublasHandle(cudaStream_t stream) {
  MOED_CUDA_CHECK(cublasCreate(&h_));
  try {
    MOED_CUDA_CHECK(cublasSetStream(h_, stream));
    // Explicit, although it is the default: fp32 GEMMs in fp32 (TF32 needs
    // CUBLAS_TF32_TENSOR_OP_MATH, bf16x9 emulation CUBLAS_FP32_EMULATED_BF16X9_MATH).
    MOED_CUDA_CHECK(cublasSetMathMode(h_, CUBLAS_DEFAULT_MATH));
  } catch (...) {
    cublasDestroy(h_);
    throw;
  }
}

CublasHandle::~CublasHandle() {
  if (h_) cublasDestroy(h_);
}

CublasHandle& CublasHandle::operator=(CublasHandle&& o) noexcept {
  if (this != &o) {
    if (h_) cublasDestroy(h_);
    h_ = std::exchange(o.h_, nullptr);
  }
  return *this;
}

void CublasHandle::set_stream(cudaStream_t stream) { MOED_CUDA_CHECK(cublasSetStream(h_, stream)); }

cudaStream_t CublasHandle::stream() const {
  cudaStream_t s = nullptr;
  MOED_CUDA_CHECK(cublasGetStream(h_, &s));
  return s;
}

}  // namespace moed::cuda
