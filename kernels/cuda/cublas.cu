// Everything of kernels/cuda that calls cuBLAS (moed_kernels_cuda): the
// handle, the fp32 gate GEMM, and the gated FFN of each expert on its group
// of rows, two cuBLAS GEMMs per expert around the gated activation.
#include <string>

#include "kernels/cuda/cuda_kernels.h"

namespace moed::cuda {

namespace detail {

void throw_cublas(cublasStatus_t status, const char* expr, const char* file, int line) {
  throw CudaError(file, line,
                  std::string(expr) + " failed: " + cublasGetStatusName(status) + " (" +
                      cublasGetStatusString(status) + ")");
}

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

void gate_logits(CublasHandle& handle, const float* x, const float* gate_w, int tokens, int hidden,
                 int experts, float* logits) {
  if (tokens < 0 || hidden < 0 || experts < 0) throw std::invalid_argument("gate_logits: negative size");
  detail::gemm_xwt(handle.get(), x, tokens, hidden, gate_w, experts, logits, hidden,
                   CUBLAS_COMPUTE_32F_PEDANTIC);
}

}  // namespace moed::cuda
