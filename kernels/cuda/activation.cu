// The gated activation on the GPU with the CPU's element functions
// (kernels/cpu/activation_body.h), built with --fmad=false so that nothing is
// contracted into an fma: the same bits as kernels::silu_mul and
// kernels::clamped_swiglu.
#include "kernels/cpu/activation_body.h"
#include "kernels/cuda/cuda_kernels.h"

namespace moed::cuda {

namespace {

constexpr int kThreads = 256;

// One thread per element of the first F columns (gated_activation's doc);
// with `row_range` (device: first and end), only rows [first, end).
__global__ void gated_activation_kernel(float* h13, long long rows, int ffn, GatedActivation activation,
                                        const int* row_range) {
  if (row_range) {
    h13 += static_cast<long long>(row_range[0]) * 2 * ffn;
    rows = row_range[1] - row_range[0] < rows ? row_range[1] - row_range[0] : rows;
  }
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
                                                                                                activation, nullptr);
  MOED_CUDA_CHECK(cudaGetLastError());
}

void gated_activation_rows(float* h13, const int* row_range, long long max_rows, int ffn,
                           const GatedActivation& activation, cudaStream_t stream) {
  if (max_rows < 0 || ffn < 1) throw std::invalid_argument("gated_activation_rows: bad sizes");
  if (max_rows == 0) return;
  gated_activation_kernel<<<detail::grid_blocks(max_rows * ffn, kThreads), kThreads, 0, stream>>>(
      h13, max_rows, ffn, activation, row_range);
  MOED_CUDA_CHECK(cudaGetLastError());
}

}  // namespace moed::cuda
