// The experts on GPU: the gated FFN of each expert on its group of rows,
// two cuBLAS GEMMs per expert around one gated-activation kernel.
#include <string>

#include "kernels/cpu/activation_body.h"
#include "kernels/cuda/cuda_kernels.h"

namespace moed::cuda {

namespace detail {

// Row-major C[m,n] = A[m,k] · W[n,k]ᵀ with column-major cuBLAS.
//
// A row-major r x c matrix with row stride ld is, read column-major with the
// same ld, its c x r transpose. So cuBLAS sees Aᵀ (k x m, ld lda), Wᵀ (k x n,
// ld k) and must produce Cᵀ (n x m, ld n). Cᵀ = (A·Wᵀ)ᵀ = W·Aᵀ = op(Wᵀ)·Aᵀ with
// op = transpose on the stored Wᵀ and none on the stored Aᵀ:
//   gemm(T, N, n, m, k, 1, W, k, A, lda, 0, C, n).
void gemm_xwt(cublasHandle_t handle, const float* a, int m, int k, const float* w, int n, float* c,
              int lda, cublasComputeType_t compute) {
  if (m == 0 || n == 0) return;
  const float one = 1.0f, zero = 0.0f;  // host scalars (the handle's default pointer mode)
  const int ldw = k > 1 ? k : 1;        // cuBLAS rejects a leading dimension of 0
  MOED_CUDA_CHECK(cublasGemmEx(handle, CUBLAS_OP_T, CUBLAS_OP_N, n, m, k, &one, w, CUDA_R_32F, ldw, a,
                               CUDA_R_32F, lda > 1 ? lda : 1, &zero, c, CUDA_R_32F, n, compute,
                               CUBLAS_GEMM_DEFAULT));
}

}  // namespace detail

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

void expert_ffn_grouped(CublasHandle& handle, const float* x, const int* host_offsets, int experts,
                        const float* const* w13, const float* const* w2, int hidden, int ffn,
                        float* scratch, float* y, cudaStream_t stream, const GatedActivation& activation) {
  if (experts < 0 || hidden < 1 || ffn < 1) throw std::invalid_argument("expert_ffn_grouped: bad sizes");
  if (experts == 0) return;
  for (int e = 0; e < experts; ++e) {
    const int rows = host_offsets[e + 1] - host_offsets[e];
    if (rows < 0 || host_offsets[e] < 0)
      throw std::invalid_argument("expert_ffn_grouped: offsets must be non-negative and non-decreasing");
    if (rows > 0 && (!w13[e] || !w2[e]))
      throw std::invalid_argument("expert_ffn_grouped: expert " + std::to_string(e) + " has rows but no weights");
  }
  handle.set_stream(stream);
  const long long H = hidden, F2 = 2LL * ffn;
  // Up-projections: h13_e = x_e · w13ᵀ, [rows, 2F], into the expert's rows of scratch.
  for (int e = 0; e < experts; ++e) {
    const long long r0 = host_offsets[e];
    const int rows = host_offsets[e + 1] - host_offsets[e];
    if (rows) detail::gemm_xwt(handle.get(), x + r0 * H, rows, hidden, w13[e], int(F2), scratch + r0 * F2,
                               hidden, CUBLAS_COMPUTE_32F);
  }
  // One activation launch over every expert's rows.
  const long long first = host_offsets[0], total = host_offsets[experts] - first;
  gated_activation(scratch + first * F2, total, ffn, activation, stream);
  // Down-projections: y_e = act_e · w2ᵀ, act read with a row stride of 2F.
  for (int e = 0; e < experts; ++e) {
    const long long r0 = host_offsets[e];
    const int rows = host_offsets[e + 1] - host_offsets[e];
    if (rows) detail::gemm_xwt(handle.get(), scratch + r0 * F2, rows, ffn, w2[e], hidden, y + r0 * H,
                               int(F2), CUBLAS_COMPUTE_32F);
  }
}

}  // namespace moed::cuda
