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
