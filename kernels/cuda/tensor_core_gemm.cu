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

__global__ void __launch_bounds__(kThreads)
    gemm_tensor_core_grouped_kernel(const float* a, int lda, const tensor_detail::GroupedTile* tiles,
                                    const DeviceMatrix* w, long long k_begin, long long k_end, float* c, int ldc) {
  __shared__ tensor_detail::TileShared shared;
  tensor_detail::grouped_tile(int(threadIdx.x), blockIdx.x, tiles[blockIdx.y], shared, a, lda, w, k_begin, k_end, c,
                              ldc);
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

// `bytes` of host data in `buffer` on the device, grown as needed.
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
  const std::vector<tensor_detail::GroupedTile> tiles = tensor_detail::grouped_tiles(host_offsets, experts);
  if (tiles.empty()) return;
  if (tiles.size() > 65535u) throw std::invalid_argument("gemm_tensor_core_grouped: more than 65535 tiles of rows");
  const auto* d_tiles = on_device(scratch.tiles, tiles.data(), tiles.size(), stream);
  const auto* d_matrices = on_device(scratch.matrices, host_matrices, std::size_t(experts), stream);
  const dim3 grid(unsigned((host_matrices[0].n + kCols - 1) / kCols), unsigned(tiles.size()));
  gemm_tensor_core_grouped_kernel<<<grid, kThreads, 0, stream>>>(a, lda, d_tiles, d_matrices, k_begin, k_end, c, ldc);
  MOED_CUDA_CHECK(cudaGetLastError());
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
  std::vector<DeviceMatrix> w13(static_cast<std::size_t>(experts)), w2(static_cast<std::size_t>(experts));
  for (int e = 0; e < experts; ++e) {
    const DeviceExpert& x_e = host_experts[e];
    if (x_e.hidden != first.hidden || x_e.ffn != first.ffn || x_e.activation.clamped != first.activation.clamped ||
        x_e.activation.alpha != first.activation.alpha || x_e.activation.limit != first.activation.limit)
      throw std::invalid_argument("expert_ffn_grouped_tensor: expert " + std::to_string(e) +
                                  " differs from expert 0 in its shape or activation");
    w13[std::size_t(e)] = x_e.w13;
    w2[std::size_t(e)] = x_e.w2;
  }
  const int H = first.hidden, F = first.ffn;
  const long long F2 = 2LL * F;
  gemm_tensor_core_grouped(x, H, host_offsets, experts, w13.data(), 0, H, h13, int(F2), scratch, stream);
  for (int e = 0; e < experts; ++e)
    if (host_experts[e].b13)
      detail::add_bias(h13 + host_offsets[e] * F2, host_offsets[e + 1] - host_offsets[e], int(F2), F2,
                       host_experts[e].b13, stream);
  const long long first_row = host_offsets[0], total = host_offsets[experts] - first_row;
  gated_activation(h13 + first_row * F2, total, F, first.activation, stream);
  gemm_tensor_core_grouped(h13, int(F2), host_offsets, experts, w2.data(), 0, F, y, H, scratch, stream);
  for (int e = 0; e < experts; ++e)
    if (host_experts[e].b2)
      detail::add_bias(y + static_cast<long long>(host_offsets[e]) * H, host_offsets[e + 1] - host_offsets[e], H,
                       H, host_experts[e].b2, stream);
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
