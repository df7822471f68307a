// The combine in exact fixed point, on GPU: the same integer arithmetic as
// kernels/cpu/fixed_combine.cc, so CPU and GPU partial sums mix bit-exactly.
#include "kernels/cuda/cuda_kernels.h"

namespace moed::cuda {

namespace {

constexpr int kThreads = 256;
constexpr double kFixedOne = 0x1p32;
constexpr double kFixedLimit = 0x1p62;  // as the CPU: a term's largest magnitude

// One thread per (pair, column). Every step is exact or correctly rounded once
// (no additions, so no FMA contraction can change a bit): double(w) * 2^32 and
// its product with double(y) are exact (24-bit significands), and
// __double2ll_rn rounds half to even like the CPU's nearbyint. The 64-bit
// atomicAdd wraps like the CPU's unsigned addition and is associative, so the
// order in which threads land does not matter.
__global__ void combine_fixed_kernel(const float* y, const float* gate_weight, const int* pair_token,
                                     int pairs, int hidden, unsigned long long* acc,
                                     unsigned long long* saturated) {
  const long long total = static_cast<long long>(pairs) * hidden;
  for (long long i = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<long long>(gridDim.x) * blockDim.x) {
    const long long p = i / hidden, c = i % hidden;
    const int token = pair_token[p];
    if (token < 0) continue;  // a pair with no destination row here
    double t = double(gate_weight[p]) * kFixedOne * double(y[i]);
    if (!(fabs(t) < kFixedLimit)) {  // also catches NaN
      if (saturated) atomicAdd(saturated, 1ULL);
      t = isnan(t) ? 0.0 : copysign(kFixedLimit, t);
    }
    const long long term = __double2ll_rn(t);
    atomicAdd(&acc[static_cast<long long>(token) * hidden + c], static_cast<unsigned long long>(term));
  }
}

// out = fp32(x + acc * 2^-32): the product is exact, so a fused multiply-add
// rounds the same as the CPU's separate multiply and add.
__global__ void residual_kernel(const float* x, const long long* acc, long long n, float* out) {
  for (long long i = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<long long>(gridDim.x) * blockDim.x)
    out[i] = static_cast<float>(double(x[i]) + double(acc[i]) * (1.0 / kFixedOne));
}

}  // namespace

void combine_fixed(const float* y, const float* gate_weight, const int* pair_token, int pairs,
                   int hidden, long long* acc, unsigned long long* saturated, cudaStream_t stream) {
  if (pairs < 0 || hidden < 0) throw std::invalid_argument("combine_fixed: negative size");
  const long long total = static_cast<long long>(pairs) * hidden;
  if (total == 0) return;
  static_assert(sizeof(long long) == sizeof(unsigned long long), "same-width reinterpretation");
  combine_fixed_kernel<<<detail::grid_blocks(total, kThreads), kThreads, 0, stream>>>(
      y, gate_weight, pair_token, pairs, hidden, reinterpret_cast<unsigned long long*>(acc), saturated);
  MOED_CUDA_CHECK(cudaGetLastError());
}

void residual_from_fixed(const float* x, const long long* acc, int tokens, int hidden, float* out,
                         cudaStream_t stream) {
  if (tokens < 0 || hidden < 0) throw std::invalid_argument("residual_from_fixed: negative size");
  const long long n = static_cast<long long>(tokens) * hidden;
  if (n == 0) return;
  residual_kernel<<<detail::grid_blocks(n, kThreads), kThreads, 0, stream>>>(x, acc, n, out);
  MOED_CUDA_CHECK(cudaGetLastError());
}

}  // namespace moed::cuda
