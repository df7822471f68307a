// The routing step on GPU: RMSNorm and softmax + top-k (the gate GEMM: cublas.cu).
#include <cmath>
#include <climits>
#include <string>

#include "kernels/cuda/cuda_kernels.h"

namespace moed::cuda {

namespace {

// ---- rms_norm ----------------------------------------------------------------

// Fixed, not a launch parameter: the reduction tree (and so the bits) depends on it.
constexpr int kNormThreads = 256;

// One block per row. Thread t sums the squares of columns t, t+256, ... in
// order, then a shared-memory halving tree adds the 256 partial sums; all in
// double, as the CPU (which sums in plain order) does.
__global__ void rms_norm_kernel(const float* x, const float* weight, int hidden, float eps, float* out) {
  __shared__ double partial[kNormThreads];
  const float* xr = x + static_cast<long long>(blockIdx.x) * hidden;
  float* o = out + static_cast<long long>(blockIdx.x) * hidden;
  double ss = 0;
  for (int i = threadIdx.x; i < hidden; i += kNormThreads) ss += double(xr[i]) * double(xr[i]);
  partial[threadIdx.x] = ss;
  __syncthreads();
  for (int s = kNormThreads / 2; s > 0; s >>= 1) {
    if (int(threadIdx.x) < s) partial[threadIdx.x] += partial[threadIdx.x + s];
    __syncthreads();
  }
  // Same expression as the CPU: double sqrt and division are correctly rounded.
  const float inv = float(1.0 / sqrt(partial[0] / double(hidden) + double(eps)));
  // Each thread reads its columns before writing them, so out may alias x.
  for (int i = threadIdx.x; i < hidden; i += kNormThreads) o[i] = xr[i] * inv * weight[i];
}

// ---- router_topk ------------------------------------------------------------

constexpr int kMaxExperts = 512;
constexpr int kMaxTopK = 16;
constexpr int kSlots = kMaxExperts / 32;  // logits one lane holds: experts lane, lane+32, ...
constexpr int kTopKWarps = 4;             // tokens per block, one warp each
constexpr unsigned kFullMask = 0xffffffffu;

// The ranking: higher z first, then smaller expert id. Ids are distinct and
// NaN has been replaced, so this is a strict total order: any comparison
// sequence picks the same winner.
__device__ __forceinline__ bool ranks_before(float za, int ia, float zb, int ib) {
  return za > zb || (za == zb && ia < ib);
}

__global__ void router_topk_kernel(const float* logits, int tokens, int experts, int k, float temperature,
                                   int* expert_ids, float* weights) {
  const int lane = threadIdx.x & 31;
  const long long token = static_cast<long long>(blockIdx.x) * kTopKWarps + threadIdx.x / 32;
  if (token >= tokens) return;  // the whole warp leaves together
  const float* row = logits + token * experts;

  // Registers only: every loop over slots is unrolled, so z[] is never indexed dynamically.
  float z[kSlots];
  unsigned taken = 0;  // bit s set: slot s already chosen, or past the last expert
#pragma unroll
  for (int s = 0; s < kSlots; ++s) {
    const int e = lane + 32 * s;
    float v = -INFINITY;
    if (e < experts) v = row[e] / temperature;
    else taken |= 1u << s;
    z[s] = isnan(v) ? -INFINITY : v;
  }

  // k rounds of a warp-wide argmax; lane r keeps the r-th choice.
  int my_id = -1;
  float my_z = -INFINITY, z_max = -INFINITY;
  for (int r = 0; r < k; ++r) {
    float bz = -INFINITY;
    int bid = INT_MAX;  // "none": any real candidate, even at -inf, ranks before it
#pragma unroll
    for (int s = 0; s < kSlots; ++s)
      if (!((taken >> s) & 1u) && ranks_before(z[s], lane + 32 * s, bz, bid)) {
        bz = z[s];
        bid = lane + 32 * s;
      }
    // Butterfly: after 5 steps every lane holds the same (total-order) winner.
    for (int off = 16; off > 0; off >>= 1) {
      const float oz = __shfl_xor_sync(kFullMask, bz, off);
      const int oid = __shfl_xor_sync(kFullMask, bid, off);
      if (ranks_before(oz, oid, bz, bid)) {
        bz = oz;
        bid = oid;
      }
    }
    if ((bid & 31) == lane) taken |= 1u << (bid >> 5);
    if (lane == r) {
      my_id = bid;
      my_z = bz;
    }
    if (r == 0) z_max = bz;
  }

  // softmax then renormalisation over the k = exp(z - z_max) / sum over the k
  // (the softmax denominator cancels). z == z_max gives 1 also when z_max is
  // ±inf. The sum runs in rank order, identically on every lane.
  const double e = lane < k ? (my_z == z_max ? 1.0 : exp(double(my_z) - double(z_max))) : 0.0;
  double sum = 0;
  for (int r = 0; r < k; ++r) sum += __shfl_sync(kFullMask, e, r);
  if (lane < k) {
    expert_ids[token * k + lane] = my_id;
    weights[token * k + lane] = float(e / sum);
  }
}

}  // namespace

void rms_norm(const float* x, const float* weight, int rows, int hidden, float eps, float* out,
              cudaStream_t stream) {
  if (rows < 0 || hidden < 0) throw std::invalid_argument("rms_norm: negative size");
  if (rows == 0 || hidden == 0) return;
  rms_norm_kernel<<<rows, kNormThreads, 0, stream>>>(x, weight, hidden, eps, out);
  MOED_CUDA_CHECK(cudaGetLastError());
}

void router_topk(const float* logits, int tokens, int experts, int k, float temperature,
                 int* expert_ids, float* weights, cudaStream_t stream) {
  if (tokens < 0 || experts < 1 || experts > kMaxExperts || k < 1 || k > kMaxTopK || k > experts)
    throw std::invalid_argument("router_topk: need 1 <= k <= min(16, experts), experts <= 512; got k=" +
                                std::to_string(k) + ", experts=" + std::to_string(experts));
  if (!(temperature > 0.0f) || std::isinf(temperature))
    throw std::invalid_argument("router_topk: temperature must be positive and finite");
  if (tokens == 0) return;
  const unsigned blocks = unsigned((tokens + kTopKWarps - 1) / kTopKWarps);
  router_topk_kernel<<<blocks, 32 * kTopKWarps, 0, stream>>>(logits, tokens, experts, k, temperature,
                                                             expert_ids, weights);
  MOED_CUDA_CHECK(cudaGetLastError());
}

}  // namespace moed::cuda
