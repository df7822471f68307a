// The gated activation on the GPU with the CPU's element functions
// (kernels/cpu/activation_body.h), built with --fmad=false so that nothing is
// contracted into an fma: the same bits as kernels::silu_mul and
// kernels::clamped_swiglu.
#include "kernels/cpu/activation_body.h"
#include "kernels/cuda/cuda_kernels.h"

namespace moed::cuda {

namespace {

constexpr int kThreads = 256;

// One thread per element of the first F columns (gated_activation's doc).
__global__ void gated_activation_kernel(float* h13, long long rows, int ffn, GatedActivation activation) {
  const long long n = rows * ffn;
  for (long long i = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<long long>(gridDim.x) * blockDim.x) {
    float* row = h13 + (i / ffn) * 2 * ffn;
    const long long col = i % ffn;
    row[col] = activation.clamped
                   ? kernels::detail::clamped_swiglu_element(row[col], row[ffn + col], activation.alpha,
                                                             activation.limit)
                   : kernels::detail::silu_mul_element(row[col], row[ffn + col]);
  }
}

}  // namespace

void gated_activation(float* h13, long long rows, int ffn, const GatedActivation& activation, cudaStream_t stream) {
  if (rows < 0 || ffn < 1) throw std::invalid_argument("gated_activation: bad sizes");
  if (rows == 0) return;
  gated_activation_kernel<<<detail::grid_blocks(rows * ffn, kThreads), kThreads, 0, stream>>>(h13, rows, ffn,
                                                                                                activation);
  MOED_CUDA_CHECK(cudaGetLastError());
}

}  // namespace moed::cuda
