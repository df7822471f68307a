// The GEMM with bf16 products on the tensor cores over weights in their
// resident format (tensor_core_tile.cuh): fixed 64 x 64 tiles of C and a
// fixed k order, so a row's bits do not depend on its batch.
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/tensor_core_tile.cuh"

namespace moed::cuda {

namespace {

using tensor_detail::kCols;
using tensor_detail::kRows;
using tensor_detail::kThreads;
constexpr int kElementThreads = 256;  // the bias kernel's blocks

__global__ void __launch_bounds__(kThreads)
    gemm_tensor_core_kernel(const float* a, int m, int lda, DeviceMatrix w, long long k_begin, long long k_end,
                            float* c, int ldc) {
  __shared__ tensor_detail::TileShared shared;
  tensor_detail::tensor_tile(int(threadIdx.x), blockIdx.x, blockIdx.y, shared, a, m, lda, w, k_begin, k_end, c, ldc);
}

// The launch over device offsets: grid.y bounds the tiles; blocks past the
// last tile leave at once.
__global__ void __launch_bounds__(kThreads)
    gemm_tensor_core_grouped_device_kernel(const float* a, int lda, const int* offsets, int experts,
                                           const DeviceMatrix* w, long long k_begin, long long k_end, float* c,
                                           int ldc) {
  __shared__ tensor_detail::TileShared shared;
  __shared__ tensor_detail::GroupedTile tile;
  __shared__ bool found;
  if (threadIdx.x == 0) found = tensor_detail::tile_at(int(blockIdx.y), offsets, experts, tile);
  __syncthreads();
  if (!found) return;
  tensor_detail::grouped_tile(int(threadIdx.x), blockIdx.x, tile, shared, a, lda, w, k_begin, k_end, c, ldc);
}

// rows[r, j] += bias[e][j] for the expert e whose rows hold r (none where bias[e] is null).
__global__ void add_bias_grouped_kernel(float* rows, long long max_rows, int width, long long stride,
                                        const int* offsets, int experts, const float* const* bias) {
  const long long n = max_rows * width;
  for (long long i = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<long long>(gridDim.x) * blockDim.x) {
    const long long r = offsets[0] + i / width, j = i % width;
    if (r >= offsets[experts]) continue;
    int e = 0;
    while (offsets[e + 1] <= r) ++e;
    if (bias[e]) rows[r * stride + j] = __fadd_rn(rows[r * stride + j], bias[e][j]);
  }
}

// `count` elements of host data in `buffer` on the device (grown as
// needed), copied in the stream's order.
template <class T>
const T* on_device(DeviceBuffer<unsigned char>& buffer, const T* host, std::size_t count, cudaStream_t stream) {
  const std::size_t bytes = count * sizeof(T);
  if (buffer.size() < bytes) buffer = DeviceBuffer<unsigned char>(bytes);
  MOED_CUDA_CHECK(cudaMemcpyAsync(buffer.data(), host, bytes, cudaMemcpyHostToDevice, stream));
  return reinterpret_cast<const T*>(buffer.data());
}

}  // namespace

void gemm_tensor_core_grouped(const float* a, int lda, const int* host_offsets, int experts,
                              const DeviceMatrix* host_matrices, long long k_begin, long long k_end, float* c,
                              int ldc, GroupedScratch& scratch, cudaStream_t stream) {
  if (experts < 0) throw std::invalid_argument("gemm_tensor_core_grouped: a negative expert count");
  if (experts == 0) return;
  for (int e = 0; e < experts; ++e) {
    const int rows = host_offsets[e + 1] - host_offsets[e];
    if (rows < 0 || host_offsets[e] < 0)
      throw std::invalid_argument("gemm_tensor_core_grouped: offsets must be non-negative and non-decreasing");
    if (host_matrices[e].n != host_matrices[0].n)
      throw std::invalid_argument("gemm_tensor_core_grouped: expert " + std::to_string(e) + " has " +
                                  std::to_string(host_matrices[e].n) + " columns, expert 0 " +
                                  std::to_string(host_matrices[0].n));
    if (rows > 0) detail::check_gemm_arguments("gemm_tensor_core_grouped", rows, lda, host_matrices[e], k_begin,
                                               k_end, ldc);
  }
  // The same launch as from device offsets, the host's uploaded to the scratch.
  const int* d_offsets = on_device(scratch.offsets, host_offsets, std::size_t(experts) + 1, stream);
  const DeviceMatrix* d_matrices = on_device(scratch.w13, host_matrices, std::size_t(experts), stream);
  gemm_tensor_core_grouped_device(a, lda, d_offsets, experts, host_offsets[experts] - host_offsets[0], d_matrices,
                                  host_matrices[0].n, k_begin, k_end, c, ldc, stream);
}

void gemm_tensor_core_grouped_device(const float* a, int lda, const int* device_offsets, int experts, int max_rows,
                                     const DeviceMatrix* device_matrices, long long n, long long k_begin,
                                     long long k_end, float* c, int ldc, cudaStream_t stream) {
  if (experts < 1 || max_rows < 0 || n < 1 || k_begin < 0 || k_begin > k_end || lda < k_end - k_begin || ldc < n)
    throw std::invalid_argument("gemm_tensor_core_grouped_device: bad sizes (experts " + std::to_string(experts) +
                                ", rows " + std::to_string(max_rows) + ", n " + std::to_string(n) + ", k range [" +
                                std::to_string(k_begin) + ", " + std::to_string(k_end) + "))");
  const long long tiles = (max_rows + kRows - 1) / kRows + experts;  // at most one partial tile per expert
  if (tiles > 65535) throw std::invalid_argument("gemm_tensor_core_grouped_device: more than 65535 tiles of rows");
  const dim3 grid(unsigned((n + kCols - 1) / kCols), unsigned(tiles));
  gemm_tensor_core_grouped_device_kernel<<<grid, kThreads, 0, stream>>>(a, lda, device_offsets, experts,
                                                                        device_matrices, k_begin, k_end, c, ldc);
  MOED_CUDA_CHECK(cudaGetLastError());
}

void expert_ffn_grouped_tensor_device(const float* x, const int* device_offsets, int max_rows,
                                      const DeviceGroupedExperts& experts, float* h13, float* y,
                                      cudaStream_t stream) {
  const int E = experts.count, H = experts.hidden, F = experts.ffn;
  const long long F2 = 2LL * F;
  auto biases = [&](float* rows, int width, const float* const* bias) {
    if (!bias || max_rows == 0) return;
    const long long n = static_cast<long long>(max_rows) * width;
    add_bias_grouped_kernel<<<detail::grid_blocks(n, kElementThreads), kElementThreads, 0, stream>>>(
        rows, max_rows, width, width, device_offsets, E, bias);
    MOED_CUDA_CHECK(cudaGetLastError());
  };
  gemm_tensor_core_grouped_device(x, H, device_offsets, E, max_rows, experts.w13, F2, 0, H, h13, int(F2), stream);
  biases(h13, int(F2), experts.b13);
  // The rows [offsets[0], offsets[E]): the offsets' first and last entries.
  if (E >= 1 && max_rows > 0) {
    if (experts.row_range_scratch == nullptr)
      throw std::invalid_argument("expert_ffn_grouped_tensor_device: no row range scratch");
    MOED_CUDA_CHECK(cudaMemcpyAsync(experts.row_range_scratch, device_offsets, sizeof(int),
                                    cudaMemcpyDeviceToDevice, stream));
    MOED_CUDA_CHECK(cudaMemcpyAsync(experts.row_range_scratch + 1, device_offsets + E, sizeof(int),
                                    cudaMemcpyDeviceToDevice, stream));
  }
  gated_activation_rows(h13, experts.row_range_scratch, max_rows, F, experts.activation, stream);
  gemm_tensor_core_grouped_device(h13, int(F2), device_offsets, E, max_rows, experts.w2, H, 0, F, y, H, stream);
  biases(y, H, experts.b2);
}

void expert_ffn_grouped_tensor(const float* x, const int* host_offsets, int experts, const DeviceExpert* host_experts,
                               float* h13, float* y, GroupedScratch& scratch, cudaStream_t stream) {
  if (experts < 0) throw std::invalid_argument("expert_ffn_grouped_tensor: a negative expert count");
  if (experts == 0) return;
  const DeviceExpert& first = host_experts[0];
  const std::size_t E = static_cast<std::size_t>(experts);
  std::vector<DeviceMatrix> w13(E), w2(E);
  std::vector<const float*> b13(E), b2(E);
  for (std::size_t e = 0; e < E; ++e) {
    const DeviceExpert& x_e = host_experts[e];
    if (x_e.hidden != first.hidden || x_e.ffn != first.ffn || x_e.activation.clamped != first.activation.clamped ||
        x_e.activation.alpha != first.activation.alpha || x_e.activation.limit != first.activation.limit)
      throw std::invalid_argument("expert_ffn_grouped_tensor: expert " + std::to_string(e) +
                                  " differs from expert 0 in its shape or activation");
    if (host_offsets[e + 1] < host_offsets[e] || host_offsets[e] < 0)
      throw std::invalid_argument("expert_ffn_grouped_tensor: offsets must be non-negative and non-decreasing");
    w13[e] = x_e.w13;
    w2[e] = x_e.w2;
    b13[e] = x_e.b13;
    b2[e] = x_e.b2;
  }
  // The launches from device offsets, the host's uploaded to the scratch.
  DeviceGroupedExperts grouped;
  grouped.count = experts;
  grouped.hidden = first.hidden;
  grouped.ffn = first.ffn;
  grouped.activation = first.activation;
  grouped.w13 = on_device(scratch.w13, w13.data(), E, stream);
  grouped.w2 = on_device(scratch.w2, w2.data(), E, stream);
  grouped.b13 = on_device(scratch.b13, b13.data(), E, stream);
  grouped.b2 = on_device(scratch.b2, b2.data(), E, stream);
  if (scratch.row_range.size() < 2 * sizeof(int)) scratch.row_range = DeviceBuffer<unsigned char>(2 * sizeof(int));
  grouped.row_range_scratch = reinterpret_cast<int*>(scratch.row_range.data());
  const int* d_offsets = on_device(scratch.offsets, host_offsets, E + 1, stream);
  expert_ffn_grouped_tensor_device(x, d_offsets, host_offsets[experts] - host_offsets[0], grouped, h13, y, stream);
}

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
