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

// One warp per row, one row per block.
__global__ void rms_norm_kernel(const float* x, const float* weight, int hidden, float eps, float* out) {
  const long long row = blockIdx.x;
  route_detail::rms_norm_row(int(threadIdx.x), x + row * hidden, weight, hidden, eps, out + row * hidden);
}

// logits[t, e] += bias[e]: gpt-oss's router bias, one fp32 add as on the CPU.
__global__ void add_row_bias_kernel(float* rows, long long count, int width, const float* bias) {
  const long long i = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < count * width) rows[i] += bias[i % width];
}

// ---- route_tokens -----------------------------------------------------------

// One warp per token, one token per block.
__global__ void route_kernel(const float* logits, int experts, kernels::RouteRule rule, const float* bias,
                             const double* adjust, int width, int* expert_ids, float* weights, int* counts) {
  extern __shared__ double shared[];
  route_detail::route_token(int(threadIdx.x), blockIdx.x, shared, logits, experts, rule, bias, adjust, width,
                            expert_ids, weights, counts);
}

}  // namespace

void rms_norm(const float* x, const float* weight, int rows, int hidden, float eps, float* out,
              cudaStream_t stream) {
  if (rows < 0 || hidden < 0) throw std::invalid_argument("rms_norm: negative size");
  if (rows == 0 || hidden == 0) return;
  rms_norm_kernel<<<rows, 32, 0, stream>>>(x, weight, hidden, eps, out);
  MOED_CUDA_CHECK(cudaGetLastError());
}

void add_row_bias(float* rows, int count, int width, const float* bias, cudaStream_t stream) {
  if (count < 0 || width < 0) throw std::invalid_argument("add_row_bias: negative size");
  const long long n = static_cast<long long>(count) * width;
  if (n == 0) return;
  add_row_bias_kernel<<<unsigned((n + 255) / 256), 256, 0, stream>>>(rows, count, width, bias);
  MOED_CUDA_CHECK(cudaGetLastError());
}

void route_tokens(const float* logits, int tokens, int experts, const kernels::RouteRule& rule,
                  const float* selection_bias, const double* adjust, int* expert_ids, float* weights, int* counts,
                  cudaStream_t stream) {
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
  route_kernel<<<unsigned(tokens), 32, bytes, stream>>>(logits, experts, rule, selection_bias, adjust, width,
                                                         expert_ids, weights, counts);
  MOED_CUDA_CHECK(cudaGetLastError());
}

}  // namespace moed::cuda
