// Grouping (token, expert) pairs by expert, and gathering rows into that order.
#include <cstdint>

#include "kernels/cuda/cuda_kernels.h"

namespace moed::cuda {

namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kScanThreads = 1024;
constexpr unsigned kFullMask = 0xffffffffu;

// counts[e] = pairs with expert e (integer atomics: the result is order-free).
__global__ void histogram_kernel(const int* expert_ids, int pairs, int experts, int* counts) {
  for (int p = blockIdx.x * blockDim.x + threadIdx.x; p < pairs; p += gridDim.x * blockDim.x) {
    const int e = expert_ids[p];
    if (e >= 0 && e < experts) atomicAdd(&counts[e], 1);
  }
}

// offsets = exclusive prefix sum of counts, offsets[n] = total. One block, in
// chunks of 1024 with a Hillis-Steele scan per chunk and a carry between them.
__global__ void exclusive_scan_kernel(const int* counts, int n, int* offsets) {
  __shared__ int buf[kScanThreads];
  const int t = threadIdx.x;
  int carry = 0;
  for (int base = 0; base < n; base += kScanThreads) {
    const int v = base + t < n ? counts[base + t] : 0;
    buf[t] = v;
    __syncthreads();
    for (int off = 1; off < kScanThreads; off <<= 1) {
      const int add = t >= off ? buf[t - off] : 0;
      __syncthreads();
      buf[t] += add;
      __syncthreads();
    }
    if (base + t < n) offsets[base + t] = carry + buf[t] - v;
    carry += buf[kScanThreads - 1];
    __syncthreads();  // every thread has read buf before the next chunk overwrites it
  }
  if (t == 0) offsets[n] = carry;
}

// One block per expert walks all pairs in order, 256 at a time, and writes the
// ones of its expert to consecutive slots from offsets[e]: a ballot gives each
// pair its rank among the chunk's matches, so the order is stable by
// construction (no atomics, no dependence on scheduling).
__global__ void stable_scatter_kernel(const int* expert_ids, int pairs, const int* offsets, int* order) {
  __shared__ int warp_matches[kWarps];
  const int e = blockIdx.x, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int end = offsets[e + 1];
  int next = offsets[e];  // the same in every thread
  for (int base = 0; base < pairs && next < end; base += kThreads) {
    const int p = base + threadIdx.x;
    const bool match = p < pairs && expert_ids[p] == e;
    const unsigned ballot = __ballot_sync(kFullMask, match);
    if (lane == 0) warp_matches[warp] = __popc(ballot);
    __syncthreads();
    int before = 0, total = 0;
    for (int w = 0; w < kWarps; ++w) {
      before += w < warp ? warp_matches[w] : 0;
      total += warp_matches[w];
    }
    if (match) order[next + before + __popc(ballot & ((1u << lane) - 1u))] = p;
    next += total;
    __syncthreads();  // warp_matches is rewritten by the next chunk
  }
}

__global__ void divide_kernel(const int* order, int n, int k, int* token) {
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
    token[i] = order[i] / k;
}

// dst row i = src row row_index[i]; T is float, or float4 when rows allow it.
template <class T>
__global__ void gather_rows_kernel(const T* src, const int* row_index, long long n, int width, T* dst) {
  const long long total = n * width;
  for (long long i = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<long long>(gridDim.x) * blockDim.x) {
    const long long r = i / width, c = i % width;
    dst[i] = src[static_cast<long long>(row_index[r]) * width + c];
  }
}

}  // namespace

void count_and_offsets(const int* expert_ids, int pairs, int experts, int* counts, int* offsets,
                       int* order, cudaStream_t stream) {
  if (pairs < 0 || experts < 0) throw std::invalid_argument("count_and_offsets: negative size");
  if (experts > 0) MOED_CUDA_CHECK(cudaMemsetAsync(counts, 0, sizeof(int) * experts, stream));
  if (pairs > 0 && experts > 0) {
    histogram_kernel<<<detail::grid_blocks(pairs, kThreads), kThreads, 0, stream>>>(expert_ids, pairs,
                                                                                    experts, counts);
    MOED_CUDA_CHECK(cudaGetLastError());
  }
  exclusive_scan_kernel<<<1, kScanThreads, 0, stream>>>(counts, experts, offsets);
  MOED_CUDA_CHECK(cudaGetLastError());
  if (pairs > 0 && experts > 0) {
    stable_scatter_kernel<<<experts, kThreads, 0, stream>>>(expert_ids, pairs, offsets, order);
    MOED_CUDA_CHECK(cudaGetLastError());
  }
}

void pair_tokens(const int* order, int n, int k, int* token, cudaStream_t stream) {
  if (n < 0 || k < 1) throw std::invalid_argument("pair_tokens: need n >= 0, k >= 1");
  if (n == 0) return;
  divide_kernel<<<detail::grid_blocks(n, kThreads), kThreads, 0, stream>>>(order, n, k, token);
  MOED_CUDA_CHECK(cudaGetLastError());
}

void permute_rows(const float* src, const int* row_index, int n, int hidden, float* dst,
                  cudaStream_t stream) {
  if (n < 0 || hidden < 0) throw std::invalid_argument("permute_rows: negative size");
  if (n == 0 || hidden == 0) return;
  const bool vec4 = hidden % 4 == 0 && reinterpret_cast<std::uintptr_t>(src) % 16 == 0 &&
                    reinterpret_cast<std::uintptr_t>(dst) % 16 == 0;
  if (vec4) {
    const int width = hidden / 4;
    gather_rows_kernel<<<detail::grid_blocks(static_cast<long long>(n) * width, kThreads), kThreads, 0,
                         stream>>>(reinterpret_cast<const float4*>(src), row_index, n, width,
                                   reinterpret_cast<float4*>(dst));
  } else {
    gather_rows_kernel<<<detail::grid_blocks(static_cast<long long>(n) * hidden, kThreads), kThreads, 0,
                         stream>>>(src, row_index, n, hidden, dst);
  }
  MOED_CUDA_CHECK(cudaGetLastError());
}

}  // namespace moed::cuda
