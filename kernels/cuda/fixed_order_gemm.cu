// The fixed-order GEMM on the GPU over weights in their resident format, and
// the expert FFN built on it: every output element is kernels/cpu's fma chain
// in k order over the weights' values (kernels/cpu/fixed_order_gemm.h,
// encoded_matrix.h), so a row's bits match the CPU's fp32 products and do not
// depend on its batch. Each multiply, add and fma is an explicit _rn
// intrinsic: nothing is contracted or reassociated, whatever nvcc's flags.
#include <stdexcept>
#include <string>

#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/fixed_order_tile.cuh"

namespace moed::cuda {

namespace {

using gemm_detail::kThreads;
using gemm_detail::kTileCols;
using gemm_detail::kTileRows;
using gemm_detail::kMxBlock;

// One block per tile of C (fixed_order_tile.cuh).
__global__ void __launch_bounds__(kThreads)
    gemm_fixed_order_kernel(const float* a, int m, int lda, DeviceMatrix w, long long k_begin, long long k_end,
                            float* c, int ldc) {
  __shared__ gemm_detail::TileShared shared;
  gemm_detail::gemm_tile(int(threadIdx.x), blockIdx.x, blockIdx.y, shared, a, m, lda, w, k_begin, k_end, c, ldc);
}

// rows[r, j] += bias[j] for j < width (row stride `stride`): one IEEE add, as the CPU's add_bias.
__global__ void add_bias_kernel(float* rows, long long m, int width, long long stride, const float* bias) {
  const long long n = m * width;
  for (long long i = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<long long>(gridDim.x) * blockDim.x) {
    const long long r = i / width, j = i % width;
    rows[r * stride + j] = __fadd_rn(rows[r * stride + j], bias[j]);
  }
}

}  // namespace

namespace detail {
void add_bias(float* rows, long long m, int width, long long stride, const float* bias, cudaStream_t stream) {
  if (m == 0 || width == 0) return;
  add_bias_kernel<<<grid_blocks(m * width, kThreads), kThreads, 0, stream>>>(rows, m, width, stride, bias);
  MOED_CUDA_CHECK(cudaGetLastError());
}

void check_gemm_arguments(const char* what, int m, int lda, const DeviceMatrix& w, long long k_begin,
                          long long k_end, int ldc) {
  const std::string name(what);
  if (w.n < 1 || w.k < 1 || !w.codes) throw std::invalid_argument(name + ": an empty weight matrix");
  const bool scaled = w.dtype == DeviceDtype::fp8 || w.dtype == DeviceDtype::int8 || w.dtype == DeviceDtype::mxfp4;
  if (scaled && !w.scales) throw std::invalid_argument(name + ": a scaled format without its scales");
  if (w.dtype == DeviceDtype::mxfp4 && w.k % kMxBlock != 0)
    throw std::invalid_argument(name + ": mxfp4 needs k a multiple of 32, got " + std::to_string(w.k));
  if (m < 0 || k_begin < 0 || k_end > w.k || k_begin > k_end || lda < k_end - k_begin || ldc < w.n)
    throw std::invalid_argument(name + ": bad sizes (m " + std::to_string(m) + ", k range [" +
                                std::to_string(k_begin) + ", " + std::to_string(k_end) + ") of " +
                                std::to_string(w.k) + ", lda " + std::to_string(lda) + ", ldc " + std::to_string(ldc) +
                                ")");
}
}  // namespace detail

void gemm_fixed_order(const float* a, int m, int lda, const DeviceMatrix& w, long long k_begin, long long k_end,
                      float* c, int ldc, cudaStream_t stream) {
  detail::check_gemm_arguments("gemm_fixed_order", m, lda, w, k_begin, k_end, ldc);
  if (m == 0) return;
  const dim3 grid(unsigned((w.n + kTileCols - 1) / kTileCols), unsigned((m + kTileRows - 1) / kTileRows));
  if (grid.y > 65535u) throw std::invalid_argument("gemm_fixed_order: more than 65535 x 16 rows in one call");
  gemm_fixed_order_kernel<<<grid, kThreads, 0, stream>>>(a, m, lda, w, k_begin, k_end, c, ldc);
  MOED_CUDA_CHECK(cudaGetLastError());
}

void gemm_with(DeviceProducts products, const float* a, int m, int lda, const DeviceMatrix& w, long long k_begin,
               long long k_end, float* c, int ldc, cudaStream_t stream) {
  if (products == DeviceProducts::bf16 && w.dtype != DeviceDtype::f32)
    return gemm_tensor_core(a, m, lda, w, k_begin, k_end, c, ldc, stream);
  gemm_fixed_order(a, m, lda, w, k_begin, k_end, c, ldc, stream);
}

void expert_ffn_up_fixed(const DeviceExpert& e, const float* x, int m, float* h13, cudaStream_t stream) {
  const long long F2 = 2LL * e.ffn;
  if (e.w13.n != F2 || e.w13.k != e.hidden)
    throw std::invalid_argument("expert_ffn_up_fixed: W13 is not [2F, H]");
  gemm_with(e.products, x, m, e.hidden, e.w13, 0, e.hidden, h13, int(F2), stream);
  if (e.b13) detail::add_bias(h13, m, int(F2), F2, e.b13, stream);
  gated_activation(h13, m, e.ffn, e.activation, stream);
}

void expert_ffn_down_chunk_fixed(const DeviceExpert& e, const float* h13, int m, int chunk, float* y,
                                 cudaStream_t stream) {
  if (e.chunks < 1 || e.ffn % e.chunks != 0 || chunk < 0 || chunk >= e.chunks)
    throw std::invalid_argument("expert_ffn_down_chunk_fixed: chunk " + std::to_string(chunk) + " of " +
                                std::to_string(e.chunks) + " over an F of " + std::to_string(e.ffn));
  if (e.w2.n != e.hidden || e.w2.k != e.ffn) throw std::invalid_argument("expert_ffn_down_chunk_fixed: W2 is not [H, F]");
  const long long width = e.ffn / e.chunks, first = chunk * width;
  gemm_with(e.products, h13 + first, m, 2 * e.ffn, e.w2, first, first + width, y, e.hidden, stream);
  if (e.b2 && chunk == 0) detail::add_bias(y, m, e.hidden, e.hidden, e.b2, stream);
}

}  // namespace moed::cuda
