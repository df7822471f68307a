// The routing step on GPU: RMSNorm, and every family's router as
// runtime/router computes it (the gate GEMM: cublas.cu). Built with
// --fmad=false: the router's arithmetic is kernels/cpu/router_body.h's.
#include <cmath>
#include <string>

#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/route_kernel.cuh"

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

// ---- route_tokens -----------------------------------------------------------

// One warp per token, one token per block.
__global__ void route_kernel(const float* logits, int experts, kernels::RouteRule rule, const float* bias, int width,
                             int* expert_ids, float* weights, int* counts) {
  extern __shared__ double shared[];
  route_detail::route_token(int(threadIdx.x), blockIdx.x, shared, logits, experts, rule, bias, width, expert_ids,
                            weights, counts);
}

}  // namespace

void rms_norm(const float* x, const float* weight, int rows, int hidden, float eps, float* out,
              cudaStream_t stream) {
  if (rows < 0 || hidden < 0) throw std::invalid_argument("rms_norm: negative size");
  if (rows == 0 || hidden == 0) return;
  rms_norm_kernel<<<rows, kNormThreads, 0, stream>>>(x, weight, hidden, eps, out);
  MOED_CUDA_CHECK(cudaGetLastError());
}

void route_tokens(const float* logits, int tokens, int experts, const kernels::RouteRule& rule,
                  const float* selection_bias, int* expert_ids, float* weights, int* counts, cudaStream_t stream) {
  auto refuse = [&](const std::string& what) {
    throw std::invalid_argument("route_tokens: " + what + " (experts " + std::to_string(experts) + ", top_k " +
                                std::to_string(rule.top_k) + ", max_k " + std::to_string(rule.max_k) + ", groups " +
                                std::to_string(rule.groups_kept) + " of " + std::to_string(rule.groups) + ")");
  };
  if (tokens < 0 || experts < 1) refuse("need tokens >= 0 and experts >= 1");
  if (rule.groups < 1 || experts % rule.groups != 0 || rule.groups_kept < 1 || rule.groups_kept > rule.groups)
    refuse("the groups must divide the experts, and 1 <= kept <= groups");
  const long long selectable = (long long)(experts / rule.groups) * rule.groups_kept;
  if (rule.top_p_mode ? rule.max_k < 1 : (rule.top_k < 1 || rule.top_k > selectable))
    refuse("k must be at least 1 and at most the experts of the kept groups");
  if (!(rule.temperature > 0.0) || std::isinf(rule.temperature)) refuse("temperature must be positive and finite");
  if (tokens == 0) return;
  const int width = route_width(rule, experts);
  const std::size_t bytes = route_detail::route_shared_bytes(experts, rule.groups, width);
  // Past the default 48 KiB (about 3,000 experts), ask for more; the device's
  // limit (227 KiB on Hopper) then refuses with CUDA's own error.
  if (bytes > 48 * 1024)
    MOED_CUDA_CHECK(cudaFuncSetAttribute(route_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes)));
  route_kernel<<<unsigned(tokens), 32, bytes, stream>>>(logits, experts, rule, selection_bias, width, expert_ids,
                                                         weights, counts);
  MOED_CUDA_CHECK(cudaGetLastError());
}

}  // namespace moed::cuda
