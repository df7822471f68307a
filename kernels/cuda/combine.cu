// The combine in exact fixed point, on GPU: the same integer arithmetic as
// kernels/cpu/fixed_combine.cc, so CPU and GPU partial sums mix bit-exactly.
#include "kernels/cuda/cuda_kernels.h"

namespace moed::cuda {

namespace {

constexpr int kThreads = 256;
constexpr double kFixedOne = 0x1p32;
constexpr double kFixedLimit = 0x1p62;  // as the CPU: a term's largest magnitude

// INT64_MIN: an element poisoned by a NaN or inf term (the CPU's kFixedNaN).
constexpr unsigned long long kFixedNaN = 0x8000000000000000ULL;

// acc += term, wrapping like the CPU's unsigned addition, unless acc is
// poisoned: a compare-and-swap loop, since a plain atomicAdd would carry a
// poisoned element back into range. Wrapping addition is associative and
// poison is sticky, so the result does not depend on the order threads land in.
__device__ void add_fixed_term(unsigned long long* acc, unsigned long long term) {
  unsigned long long seen = *reinterpret_cast<volatile unsigned long long*>(acc), assumed;
  do {
    if (seen == kFixedNaN) return;
    assumed = seen;
    seen = atomicCAS(acc, assumed, assumed + term);
  } while (seen != assumed);
}

// One thread per (pair, column), with kernels/cpu/fixed_combine.cc's rule:
// double(w) * 2^32 and its product with double(y) are exact (24-bit
// significands), so no FMA contraction can change a bit, and __double2ll_rn
// rounds half to even like the CPU's llrint. A finite term beyond ±2^62
// saturates and is counted; a NaN or inf term poisons its element.
__global__ void combine_fixed_kernel(const float* y, const float* gate_weight, const int* pair_token,
                                     int pairs, int hidden, unsigned long long* acc,
                                     unsigned long long* saturated) {
  const long long total = static_cast<long long>(pairs) * hidden;
  for (long long i = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<long long>(gridDim.x) * blockDim.x) {
    const long long p = i / hidden, c = i % hidden;
    const int token = pair_token[p];
    if (token < 0) continue;  // a pair with no destination row here
    unsigned long long* element = &acc[static_cast<long long>(token) * hidden + c];
    double t = double(gate_weight[p]) * kFixedOne * double(y[i]);
    if (!(fabs(t) < kFixedLimit)) {  // also catches NaN
      if (!isfinite(t)) {
        atomicExch(element, kFixedNaN);
        continue;
      }
      if (saturated) atomicAdd(saturated, 1ULL);
      t = copysign(kFixedLimit, t);
    }
    add_fixed_term(element, static_cast<unsigned long long>(__double2ll_rn(t)));
  }
}

// out = fp32(x + acc * 2^-32), NaN where acc is poisoned: the product is
// exact, so a fused multiply-add rounds the same as the CPU's separate
// multiply and add.
__global__ void residual_kernel(const float* x, const long long* acc, long long n, float* out) {
  for (long long i = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<long long>(gridDim.x) * blockDim.x)
    out[i] = static_cast<unsigned long long>(acc[i]) == kFixedNaN
                 ? __int_as_float(0x7fc00000)
                 : static_cast<float>(double(x[i]) + double(acc[i]) * (1.0 / kFixedOne));
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
