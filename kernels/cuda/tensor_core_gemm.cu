// The GEMM with bf16 products on the tensor cores over weights in their
// resident format (tensor_core_tile.cuh): fixed 64 x 64 tiles of C and a
// fixed k order, so a row's bits do not depend on its batch.
#include <stdexcept>
#include <string>

#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/tensor_core_tile.cuh"

namespace moed::cuda {

namespace {

using tensor_detail::kCols;
using tensor_detail::kRows;
using tensor_detail::kThreads;

__global__ void __launch_bounds__(kThreads)
    gemm_tensor_core_kernel(const float* a, int m, int lda, DeviceMatrix w, long long k_begin, long long k_end,
                            float* c, int ldc) {
  __shared__ tensor_detail::TileShared shared;
  tensor_detail::tensor_tile(int(threadIdx.x), blockIdx.x, blockIdx.y, shared, a, m, lda, w, k_begin, k_end, c, ldc);
}

}  // namespace

void gemm_tensor_core(const float* a, int m, int lda, const DeviceMatrix& w, long long k_begin, long long k_end,
                      float* c, int ldc, cudaStream_t stream) {
  detail::check_gemm_arguments("gemm_tensor_core", m, lda, w, k_begin, k_end, ldc);
  if (m == 0) return;
  const dim3 grid(unsigned((w.n + kCols - 1) / kCols), unsigned((m + kRows - 1) / kRows));
  if (grid.y > 65535u) throw std::invalid_argument("gemm_tensor_core: more than 65535 x 64 rows in one call");
  gemm_tensor_core_kernel<<<grid, kThreads, 0, stream>>>(a, m, lda, w, k_begin, k_end, c, ldc);
  MOED_CUDA_CHECK(cudaGetLastError());
}

}  // namespace moed::cuda
