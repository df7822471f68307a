// The CUDA kernels against bounds measured in the same run, on one GPU
// (tests/gpu/check.sh runs it; nothing here runs without a GPU):
//   - HBM: a device-to-device copy, bytes read + written per second;
//   - routing (route_tokens: Mixtral's softmax top-2; DeepSeek-V3's sigmoid
//     with its selection bias, 4 of 8 groups, top-8), permute (permute_rows) and combine
//     (combine_fixed): their bytes per second over that copy's;
//   - the grouped expert FFN (expert_ffn_grouped, fp32 cuBLAS per expert)
//     over one dense cuBLAS GEMM pair of the same FLOPs and compute type;
//     and with bf16 products on the tensor cores in grouped launches
//     (expert_ffn_grouped_tensor, bf16 and fp8 weights) over a dense bf16
//     cuBLAS pair of the same FLOPs (the aim: 0.7);
//   - the fixed-order GEMM (gemm_fixed_order: kernels/cpu's bits) over W13
//     in every resident format: at 1 row, the weights' bytes per second over
//     the copy's (weights of several experts, past the L2); at 256 rows,
//     its FLOP/s over dense fp32 cuBLAS's on the same shape;
//   - the tensor-core GEMM (gemm_tensor_core: bf16 products) over the same
//     weights in each compact format: at 1 row against the copy, at 256
//     rows over dense bf16 cuBLAS's on tensor cores, and fp8 also over
//     dense fp8 cuBLASLt's (fp8 products: a bound its bf16 products do not
//     aim at, printed for what it is);
//   - a whole layer on the device (route_tokens, grouping, permute, each
//     expert's FFN in the checkpoint's format, fixed-order and on the tensor
//     cores in grouped launches over the device's offsets, combine,
//     residual): tokens per second at the shape's tokens and at 64; the
//     latter also captured in a CUDA graph, against launched kernel by
//     kernel.
// Each time is the best of --reps after a warm-up, read with CUDA events.
//
// Usage: bench_gpu_kernels [--reps N] [--shape mixtral|deepseek|small]
#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <optional>
#include <random>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "kernels/cpu/encoded_matrix.h"
#include "kernels/cuda/cuda_kernels.h"

namespace {

using moed::cuda::CublasHandle;
using moed::cuda::DeviceBuffer;
using moed::cuda::Stream;

struct Shape {
  const char* name;
  int hidden, ffn, experts, top_k, tokens;
  bool sigmoid = false;  // the router: DeepSeek-V3's sigmoid with a selection bias, else softmax
  int groups = 1, groups_kept = 1;
  double scaling = 1.0;
};

// Mixtral-8x7B's and DeepSeek-V3's expert layers at a prefill step's tokens.
const Shape kShapes[] = {
    {"mixtral", 4096, 14336, 8, 2, 4096},
    {"deepseek", 7168, 2048, 256, 8, 4096, true, 8, 4, 2.5},
    {"small", 512, 1024, 16, 4, 1024},  // a quick run
};

// The best time in seconds of `reps` runs of `body` on `stream`, after one warm-up.
double best_seconds(int reps, cudaStream_t stream, const std::function<void()>& body) {
  cudaEvent_t start, stop;
  MOED_CUDA_CHECK(cudaEventCreate(&start));
  MOED_CUDA_CHECK(cudaEventCreate(&stop));
  body();
  MOED_CUDA_CHECK(cudaStreamSynchronize(stream));
  float best_ms = 1e30f;
  for (int r = 0; r < reps; ++r) {
    MOED_CUDA_CHECK(cudaEventRecord(start, stream));
    body();
    MOED_CUDA_CHECK(cudaEventRecord(stop, stream));
    MOED_CUDA_CHECK(cudaEventSynchronize(stop));
    float ms = 0;
    MOED_CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
    best_ms = std::min(best_ms, ms);
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  return double(best_ms) * 1e-3;
}

std::vector<float> random_floats(std::size_t n, unsigned seed, float scale) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(-scale, scale);
  std::vector<float> v(n);
  for (float& f : v) f = dist(rng);
  return v;
}

void print_ratio(const char* what, double bytes, double seconds, double bound_bytes_per_s) {
  const double rate = bytes / seconds;
  std::printf("%-34s %9.1f GB/s  %.3f of the copy's\n", what, rate * 1e-9, rate / bound_bytes_per_s);
}

// The fixed-order GEMM over one expert's W13 [2F, H] in each format.
// Dense fp8 cuBLASLt (e4m3 rows and weights, fp32 accumulation, bf16 out;
// the "TN" layout fp8 needs): C[m, n] = A[m, k] W[n, k]^T, the best of
// `reps`, or why it cannot run here (an older GPU, an older cuBLASLt).
std::optional<double> dense_fp8_seconds(const std::uint8_t* a_codes, const std::uint8_t* w_codes, int m, int n, int k,
                                        int reps, Stream& stream, std::string* why) {
  DeviceBuffer<unsigned char> d_a(std::size_t(m) * std::size_t(k)), d_w(std::size_t(n) * std::size_t(k));
  DeviceBuffer<unsigned char> d_c(std::size_t(m) * std::size_t(n) * 2), workspace(std::size_t(32) << 20);
  d_a.upload(a_codes, std::size_t(m) * std::size_t(k));
  d_w.upload(w_codes, std::size_t(n) * std::size_t(k));
  cublasLtHandle_t lt = nullptr;
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t wl = nullptr, al = nullptr, cl = nullptr;
  std::optional<double> seconds;
  auto ok = [&](cublasStatus_t status, const char* call) {
    if (status == CUBLAS_STATUS_SUCCESS) return true;
    *why = std::string(call) + ": " + cublasGetStatusString(status);
    return false;
  };
  const cublasOperation_t transpose = CUBLAS_OP_T, plain = CUBLAS_OP_N;
  const float one = 1.0f, zero = 0.0f;
  // Column-major: D [n, m] = op(W) [n, k] x A^T [k, m], W stored k x n.
  if (ok(cublasLtCreate(&lt), "cublasLtCreate") &&
      ok(cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F), "cublasLtMatmulDescCreate") &&
      ok(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &transpose, sizeof transpose), "TRANSA") &&
      ok(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &plain, sizeof plain), "TRANSB") &&
      ok(cublasLtMatrixLayoutCreate(&wl, CUDA_R_8F_E4M3, std::uint64_t(k), std::uint64_t(n), k), "layout W") &&
      ok(cublasLtMatrixLayoutCreate(&al, CUDA_R_8F_E4M3, std::uint64_t(k), std::uint64_t(m), k), "layout A") &&
      ok(cublasLtMatrixLayoutCreate(&cl, CUDA_R_16BF, std::uint64_t(n), std::uint64_t(m), n), "layout C")) {
    auto run = [&] {
      return cublasLtMatmul(lt, op, &one, d_w.data(), wl, d_a.data(), al, &zero, d_c.data(), cl, d_c.data(), cl,
                            nullptr, workspace.data(), workspace.size(), stream);
    };
    if (ok(run(), "cublasLtMatmul")) seconds = best_seconds(reps, stream, [&] { MOED_CUDA_CHECK(run()); });
  }
  if (cl) cublasLtMatrixLayoutDestroy(cl);
  if (al) cublasLtMatrixLayoutDestroy(al);
  if (wl) cublasLtMatrixLayoutDestroy(wl);
  if (op) cublasLtMatmulDescDestroy(op);
  if (lt) cublasLtDestroy(lt);
  return seconds;
}

void fixed_order_formats(const Shape& s, int reps, double bound, CublasHandle& handle, Stream& stream) {
  using moed::kernels::WeightDtype;
  const std::size_t n = std::size_t(2) * std::size_t(s.ffn), k = std::size_t(s.hidden), prefill_rows = 256;
  const auto w = random_floats(n * k, 5, 0.05f);
  auto a = random_floats(prefill_rows * k, 6, 1.0f);
  DeviceBuffer<float> d_a(a.size()), d_c(prefill_rows * n);
  d_a.upload(a);
  // Dense fp32 cuBLAS at the prefill rows: the compute bound's stand-in.
  DeviceBuffer<float> d_w(w.size());
  d_w.upload(w);
  const double dense_s = best_seconds(reps, stream, [&] {
    moed::cuda::detail::gemm_xwt(handle.get(), d_a.data(), int(prefill_rows), int(k), d_w.data(), int(n), d_c.data(),
                                 int(k), CUBLAS_COMPUTE_32F);
  });
  const double flops = 2.0 * double(prefill_rows) * double(n) * double(k);
  // Dense bf16 cuBLAS (tensor cores, fp32 accumulation) on the weights and
  // the rows rounded to bf16: the bound the issue names for the grouped
  // GEMM's bf16 products.
  const moed::kernels::EncodedMatrix rows_bf16 = moed::kernels::encode(WeightDtype::bf16, a.data(), prefill_rows, k);
  const moed::kernels::EncodedMatrix w_bf16 = moed::kernels::encode(WeightDtype::bf16, w.data(), n, k);
  DeviceBuffer<unsigned char> d_a16(rows_bf16.codes.size()), d_w16(w_bf16.codes.size());
  d_a16.upload(rows_bf16.codes.data(), rows_bf16.codes.size());
  d_w16.upload(w_bf16.codes.data(), w_bf16.codes.size());
  const float one = 1.0f, zero = 0.0f;
  const double dense16_s = best_seconds(reps, stream, [&] {
    MOED_CUDA_CHECK(cublasGemmEx(handle.get(), CUBLAS_OP_T, CUBLAS_OP_N, int(n), int(prefill_rows), int(k), &one,
                                 d_w16.data(), CUDA_R_16BF, int(k), d_a16.data(), CUDA_R_16BF, int(k), &zero,
                                 d_c.data(), CUDA_R_32F, int(n), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  });
  // And dense fp8 (fp8 products, which moed's tensor-core GEMM does not
  // take: it multiplies fp8 weights in bf16), where cuBLASLt runs it.
  std::string fp8_why;
  const moed::kernels::EncodedMatrix rows_fp8 = moed::kernels::encode(WeightDtype::fp8, a.data(), prefill_rows, k);
  const moed::kernels::EncodedMatrix w_fp8 = moed::kernels::encode(WeightDtype::fp8, w.data(), n, k);
  const std::optional<double> dense8_s = dense_fp8_seconds(rows_fp8.codes.data(), w_fp8.codes.data(),
                                                           int(prefill_rows), int(n), int(k), reps, stream, &fp8_why);
  if (dense8_s)
    std::printf("%-34s %9.1f TFLOP/s  (fp8 products, cuBLASLt), %zu rows\n", "dense fp8", flops / *dense8_s * 1e-12,
                prefill_rows);
  else
    std::printf("%-34s not measured: %s\n", "dense fp8", fp8_why.c_str());
  for (const WeightDtype dtype :
       {WeightDtype::f32, WeightDtype::bf16, WeightDtype::fp8, WeightDtype::mxfp4, WeightDtype::int8}) {
    const moed::kernels::EncodedMatrix m = moed::kernels::encode(dtype, w.data(), n, k);
    // Enough copies that one pass over them is at least 512 MB, far past the L2.
    const std::size_t copies = std::min<std::size_t>(64, std::max<std::size_t>(1, (std::size_t(512) << 20) / m.bytes()));
    std::vector<DeviceBuffer<unsigned char>> codes, scales;
    std::vector<moed::cuda::DeviceMatrix> views;
    for (std::size_t i = 0; i < copies; ++i) {
      codes.emplace_back(m.codes.size());
      codes.back().upload(m.codes);
      scales.emplace_back(std::max<std::size_t>(1, m.scales.size()));
      if (!m.scales.empty()) scales.back().upload(m.scales);
      views.push_back({moed::cuda::DeviceDtype(int(dtype)), (long long)n, (long long)k, codes.back().data(),
                       m.scales.empty() ? nullptr : scales.back().data()});
    }
    // One GEMM's times: 1 row over every copy (decode), and the prefill rows over one.
    using Gemm = void (*)(const float*, int, int, const moed::cuda::DeviceMatrix&, long long, long long, float*, int,
                          cudaStream_t);
    auto decode_and_prefill = [&](Gemm gemm) {
      const double one_row = best_seconds(reps, stream, [&] {
        for (const auto& v : views) gemm(d_a.data(), 1, int(k), v, 0, (long long)k, d_c.data(), int(n), stream);
      });
      const double rows = best_seconds(reps, stream, [&] {
        gemm(d_a.data(), int(prefill_rows), int(k), views[0], 0, (long long)k, d_c.data(), int(n), stream);
      });
      return std::pair{one_row, rows};
    };
    const auto [decode_s, prefill_s] = decode_and_prefill(moed::cuda::gemm_fixed_order);
    char what[80];
    std::snprintf(what, sizeof what, "fixed-order %s, 1 row (%zu x %.0f MB)", moed::kernels::to_string(dtype), copies,
                  double(m.bytes()) * 1e-6);
    print_ratio(what, double(copies) * double(m.bytes()), decode_s, bound);
    std::printf("%-34s %9.1f TFLOP/s  %.3f of dense fp32 cuBLAS (%.1f TFLOP/s), %zu rows\n",
                (std::string("fixed-order ") + moed::kernels::to_string(dtype) + ", prefill").c_str(),
                flops / prefill_s * 1e-12, dense_s / prefill_s, flops / dense_s * 1e-12, prefill_rows);
    if (dtype == WeightDtype::f32) continue;
    // The same weights with bf16 products on the tensor cores (gemm_tensor_core).
    const auto [tc_decode_s, tc_prefill_s] = decode_and_prefill(moed::cuda::gemm_tensor_core);
    std::snprintf(what, sizeof what, "tensor cores %s, 1 row", moed::kernels::to_string(dtype));
    print_ratio(what, double(copies) * double(m.bytes()), tc_decode_s, bound);
    std::printf("%-34s %9.1f TFLOP/s  %.3f of dense bf16 cuBLAS (%.1f TFLOP/s, tensor cores), %zu rows\n",
                (std::string("tensor cores ") + moed::kernels::to_string(dtype) + ", prefill").c_str(),
                flops / tc_prefill_s * 1e-12, dense16_s / tc_prefill_s, flops / dense16_s * 1e-12, prefill_rows);
    if (dtype == WeightDtype::fp8 && dense8_s)
      std::printf("%-34s %9.1f TFLOP/s  %.3f of dense fp8 cuBLASLt\n", "tensor cores fp8, prefill",
                  flops / tc_prefill_s * 1e-12, *dense8_s / tc_prefill_s);
  }
}

// A whole MoE layer on the device, as the GPU path composes it: route_tokens
// over the gate's logits, the stable grouping, the rows and gate weights
// permuted into expert order, each expert's fixed-order FFN (its weights in
// `dtype`, every expert a buffer of its own), the fixed-point combine and
// the residual. The expert offsets come back to the host once (the experts
// are launched from there). Tokens per second of the whole layer.
void layer_tokens_per_second(const Shape& s, const moed::kernels::RouteRule& rule, moed::kernels::WeightDtype dtype,
                             moed::cuda::DeviceProducts products, long long T, int reps, Stream& stream) {
  const long long H = s.hidden, F = s.ffn, pairs = T * s.top_k;
  const int E = s.experts;
  // One expert encoded on the host, copied to a buffer per expert on the device.
  const auto w13 = random_floats(std::size_t(2 * F * H), 7, 0.05f), w2 = random_floats(std::size_t(H * F), 8, 0.05f);
  const moed::kernels::EncodedMatrix e13 = moed::kernels::encode(dtype, w13.data(), std::size_t(2 * F), std::size_t(H));
  const moed::kernels::EncodedMatrix e2 = moed::kernels::encode(dtype, w2.data(), std::size_t(H), std::size_t(F));
  std::vector<DeviceBuffer<unsigned char>> buffers;
  auto on_device = [&](const std::vector<std::uint8_t>& host) {
    buffers.emplace_back(std::max<std::size_t>(1, host.size()));
    if (!host.empty()) buffers.back().upload(host.data(), host.size());
    return host.empty() ? nullptr : buffers.back().data();
  };
  buffers.reserve(std::size_t(4 * E));
  std::vector<moed::cuda::DeviceExpert> experts(static_cast<std::size_t>(E));
  for (auto& e : experts) {
    e.w13 = {moed::cuda::DeviceDtype(int(dtype)), 2 * F, H, on_device(e13.codes), on_device(e13.scales)};
    e.w2 = {moed::cuda::DeviceDtype(int(dtype)), H, F, on_device(e2.codes), on_device(e2.scales)};
    e.hidden = int(H);
    e.ffn = int(F);
    e.products = products;
  }
  const auto logits = random_floats(std::size_t(T * E), 9, 4.0f), x = random_floats(std::size_t(T * H), 10, 1.0f);
  const auto bias = random_floats(std::size_t(E), 11, 0.05f);
  DeviceBuffer<float> d_logits(logits.size()), d_x(x.size()), d_bias(bias.size()), d_out(x.size());
  d_logits.upload(logits);
  d_x.upload(x);
  d_bias.upload(bias);
  const std::size_t n_pairs = std::size_t(pairs);
  DeviceBuffer<int> d_ids(n_pairs), d_counts{std::size_t(T)}, d_expert_rows(static_cast<std::size_t>(E)),
      d_offsets(std::size_t(E) + 1), d_order(n_pairs), d_token(n_pairs);
  DeviceBuffer<float> d_weights(n_pairs), d_grouped_weights(n_pairs), d_rows(n_pairs * std::size_t(H)),
      d_h13(n_pairs * std::size_t(2 * F)), d_y(n_pairs * std::size_t(H));
  DeviceBuffer<long long> d_acc(x.size());
  std::vector<int> offsets(std::size_t(E) + 1);
  const bool tensor = products == moed::cuda::DeviceProducts::bf16;
  // bf16 products: the experts in grouped launches over the device's
  // offsets, so that nothing waits for the host and the layer can be
  // captured in a CUDA graph (timed both ways).
  std::vector<moed::cuda::DeviceMatrix> w13s, w2s;
  for (const auto& e : experts) {
    w13s.push_back(e.w13);
    w2s.push_back(e.w2);
  }
  DeviceBuffer<moed::cuda::DeviceMatrix> d_w13s(w13s.size()), d_w2s(w2s.size());
  d_w13s.upload(w13s);
  d_w2s.upload(w2s);
  DeviceBuffer<int> d_row_range(2);
  moed::cuda::DeviceGroupedExperts grouped;
  grouped.count = E;
  grouped.hidden = int(H);
  grouped.ffn = int(F);
  grouped.w13 = d_w13s.data();
  grouped.w2 = d_w2s.data();
  grouped.row_range_scratch = d_row_range.data();
  // Route, group and permute; then, after the experts, combine and add the residual.
  auto grouped_rows = [&] {
    moed::cuda::route_tokens(d_logits.data(), int(T), E, rule, rule.sigmoid ? d_bias.data() : nullptr, nullptr,
                             d_ids.data(), d_weights.data(), d_counts.data(), stream);
    moed::cuda::count_and_offsets(d_ids.data(), int(pairs), E, d_expert_rows.data(), d_offsets.data(),
                                  d_order.data(), stream);
    moed::cuda::pair_tokens(d_order.data(), int(pairs), s.top_k, d_token.data(), stream);
    moed::cuda::permute_rows(d_x.data(), d_token.data(), int(pairs), int(H), d_rows.data(), stream);
    moed::cuda::permute_rows(d_weights.data(), d_order.data(), int(pairs), 1, d_grouped_weights.data(), stream);
  };
  auto combined = [&] {
    d_acc.zero(stream);
    moed::cuda::combine_fixed(d_y.data(), d_grouped_weights.data(), d_token.data(), int(pairs), int(H), d_acc.data(),
                              nullptr, stream);
    moed::cuda::residual_from_fixed(d_x.data(), d_acc.data(), int(T), int(H), d_out.data(), stream);
  };
  auto device_layer = [&] {
    grouped_rows();
    moed::cuda::expert_ffn_grouped_tensor_device(d_rows.data(), d_offsets.data(), int(pairs), grouped, d_h13.data(),
                                                 d_y.data(), stream);
    combined();
  };
  // fp32 products: each expert's fixed-order FFN, launched from the host's copy of the offsets.
  auto host_layer = [&] {
    grouped_rows();
    MOED_CUDA_CHECK(cudaMemcpyAsync(offsets.data(), d_offsets.data(), offsets.size() * sizeof(int),
                                    cudaMemcpyDeviceToHost, stream));
    MOED_CUDA_CHECK(cudaStreamSynchronize(stream));
    for (int e = 0; e < E; ++e) {
      const int first = offsets[std::size_t(e)], m = offsets[std::size_t(e) + 1] - first;
      if (m == 0) continue;
      const auto& expert = experts[std::size_t(e)];
      moed::cuda::expert_ffn_up_fixed(expert, d_rows.data() + std::size_t(first) * std::size_t(H), m,
                                      d_h13.data() + std::size_t(first) * std::size_t(2 * F), stream);
      moed::cuda::expert_ffn_down_chunk_fixed(expert, d_h13.data() + std::size_t(first) * std::size_t(2 * F), m, 0,
                                              d_y.data() + std::size_t(first) * std::size_t(H), stream);
    }
    combined();
  };
  const double layer_s = tensor ? best_seconds(reps, stream, device_layer) : best_seconds(reps, stream, host_layer);
  const double flops = 2.0 * double(pairs) * double(H) * double(3 * F);
  char what[80];
  std::snprintf(what, sizeof what, "layer, %s experts, %lld tokens", moed::kernels::to_string(dtype), T);
  std::printf("%-34s %9.0f tokens/s  %.2f ms, experts at %.1f TFLOP/s (%s)\n", what, double(T) / layer_s,
              layer_s * 1e3, flops / layer_s * 1e-12,
              tensor ? "bf16 products, tensor cores, grouped" : "fixed-order, CUDA cores");
  if (!tensor) return;
  // The same layer captured once in a CUDA graph, then launched whole.
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  MOED_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  device_layer();
  MOED_CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
  MOED_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  const double graph_s = best_seconds(reps, stream, [&] { MOED_CUDA_CHECK(cudaGraphLaunch(exec, stream)); });
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  std::printf("%-34s %9.0f tokens/s  %.2f ms, %.2fx the layer launched kernel by kernel\n",
              (std::string(what) + ", CUDA graph").c_str(), double(T) / graph_s, graph_s * 1e3, layer_s / graph_s);
}

// The grouped FFN with bf16 products on the tensor cores
// (expert_ffn_grouped_tensor) over the same equal groups, against two dense
// bf16 cuBLAS GEMMs of the same FLOPs (the activation not included), in
// bf16 weights and in the checkpoint's fp8.
void grouped_tensor_cores(const Shape& s, const float* rows, const std::vector<int>& offsets,
                          const std::vector<float>& w13, const std::vector<float>& w2, int reps, CublasHandle& handle,
                          Stream& stream) {
  using moed::kernels::WeightDtype;
  const int E = int(offsets.size()) - 1, H = s.hidden, F = s.ffn;
  const long long total = offsets.back();
  const std::size_t n_rows = std::size_t(total);
  DeviceBuffer<float> h13(n_rows * std::size_t(2 * F)), y(n_rows * std::size_t(H));
  // Dense bf16: the rows and both matrices rounded to bf16, fp32 out.
  const std::vector<float> host_rows = [&] {
    std::vector<float> r(n_rows * std::size_t(H));
    MOED_CUDA_CHECK(cudaMemcpy(r.data(), rows, r.size() * sizeof(float), cudaMemcpyDeviceToHost));
    return r;
  }();
  const auto x16 = moed::kernels::encode(WeightDtype::bf16, host_rows.data(), n_rows, std::size_t(H));
  const auto w13_16 = moed::kernels::encode(WeightDtype::bf16, w13.data(), std::size_t(2 * F), std::size_t(H));
  const auto w2_16 = moed::kernels::encode(WeightDtype::bf16, w2.data(), std::size_t(H), std::size_t(F));
  DeviceBuffer<unsigned char> d_x16(x16.codes.size()), d_a16(n_rows * std::size_t(F) * 2);
  DeviceBuffer<unsigned char> d_w13(w13_16.codes.size()), d_w2(w2_16.codes.size());
  d_x16.upload(x16.codes.data(), x16.codes.size());
  d_a16.zero(stream);  // the activation's place: its values do not change the rate
  d_w13.upload(w13_16.codes.data(), w13_16.codes.size());
  d_w2.upload(w2_16.codes.data(), w2_16.codes.size());
  const float one = 1.0f, zero = 0.0f;
  handle.set_stream(stream);
  const double dense_s = best_seconds(reps, stream, [&] {
    MOED_CUDA_CHECK(cublasGemmEx(handle.get(), CUBLAS_OP_T, CUBLAS_OP_N, 2 * F, int(total), H, &one, d_w13.data(),
                                 CUDA_R_16BF, H, d_x16.data(), CUDA_R_16BF, H, &zero, h13.data(), CUDA_R_32F, 2 * F,
                                 CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    MOED_CUDA_CHECK(cublasGemmEx(handle.get(), CUBLAS_OP_T, CUBLAS_OP_N, H, int(total), F, &one, d_w2.data(),
                                 CUDA_R_16BF, F, d_a16.data(), CUDA_R_16BF, F, &zero, y.data(), CUDA_R_32F, H,
                                 CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  });
  const double flops = 2.0 * double(total) * double(H) * double(3 * F);
  moed::cuda::GroupedScratch scratch;
  for (const WeightDtype dtype : {WeightDtype::bf16, WeightDtype::fp8}) {
    const auto e13 = moed::kernels::encode(dtype, w13.data(), std::size_t(2 * F), std::size_t(H));
    const auto e2 = moed::kernels::encode(dtype, w2.data(), std::size_t(H), std::size_t(F));
    DeviceBuffer<unsigned char> c13(e13.codes.size()), s13(std::max<std::size_t>(1, e13.scales.size()));
    DeviceBuffer<unsigned char> c2(e2.codes.size()), s2(std::max<std::size_t>(1, e2.scales.size()));
    c13.upload(e13.codes.data(), e13.codes.size());
    c2.upload(e2.codes.data(), e2.codes.size());
    if (!e13.scales.empty()) s13.upload(e13.scales.data(), e13.scales.size());
    if (!e2.scales.empty()) s2.upload(e2.scales.data(), e2.scales.size());
    moed::cuda::DeviceExpert expert;
    expert.w13 = {moed::cuda::DeviceDtype(int(dtype)), 2LL * F, H, c13.data(),
                  e13.scales.empty() ? nullptr : s13.data()};
    expert.w2 = {moed::cuda::DeviceDtype(int(dtype)), H, F, c2.data(), e2.scales.empty() ? nullptr : s2.data()};
    expert.hidden = H;
    expert.ffn = F;
    expert.products = moed::cuda::DeviceProducts::bf16;
    // Every expert reads the same weights, as the fp32 grouped FFN above.
    const std::vector<moed::cuda::DeviceExpert> experts(static_cast<std::size_t>(E), expert);
    const double grouped_s = best_seconds(reps, stream, [&] {
      moed::cuda::expert_ffn_grouped_tensor(rows, offsets.data(), E, experts.data(), h13.data(), y.data(), scratch,
                                            stream);
    });
    char what[80];
    std::snprintf(what, sizeof what, "grouped FFN %s, tensor cores", moed::kernels::to_string(dtype));
    std::printf("%-34s %9.1f TFLOP/s  %.3f of dense bf16 cuBLAS (%.1f TFLOP/s, same FLOPs), %lld rows x %d experts\n",
                what, flops / grouped_s * 1e-12, dense_s / grouped_s, flops / dense_s * 1e-12, total / E, E);
  }
}

int run(const Shape& s, int reps) {
  cudaDeviceProp prop{};
  MOED_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  std::printf("device: %s, %d SMs; shape %s: H=%d F=%d, %d experts, top-%d, %d tokens; best of %d\n", prop.name,
              prop.multiProcessorCount, s.name, s.hidden, s.ffn, s.experts, s.top_k, s.tokens, reps);
  Stream stream;
  const long long H = s.hidden, F = s.ffn, T = s.tokens, pairs = T * s.top_k;
  const std::size_t n_pairs = std::size_t(pairs), n_experts = std::size_t(s.experts);

  // The bound: a copy of 1 GiB (far past the L2), bytes read and written.
  const std::size_t copy_bytes = std::size_t(1) << 30;
  DeviceBuffer<unsigned char> from(copy_bytes), to(copy_bytes);
  from.zero(stream);
  const double copy_s = best_seconds(reps, stream, [&] {
    MOED_CUDA_CHECK(cudaMemcpyAsync(to.data(), from.data(), copy_bytes, cudaMemcpyDeviceToDevice, stream));
  });
  const double bound = 2.0 * double(copy_bytes) / copy_s;
  std::printf("%-34s %9.1f GB/s  (the bound: bytes read + written)\n", "HBM copy, 1 GiB", bound * 1e-9);

  // Routing: logits (and the selection bias) in, ids, weights and counts out.
  auto logits = random_floats(std::size_t(T * s.experts), 1, 4.0f);
  auto bias = random_floats(n_experts, 4, 0.05f);
  DeviceBuffer<float> d_logits(logits.size()), d_weights(n_pairs), d_bias(n_experts);
  d_logits.upload(logits);
  d_bias.upload(bias);
  DeviceBuffer<int> d_ids(n_pairs), d_route_counts{std::size_t(T)};
  moed::kernels::RouteRule rule;
  rule.sigmoid = s.sigmoid;
  rule.top_k = rule.max_k = s.top_k;
  rule.groups = s.groups;
  rule.groups_kept = s.groups_kept;
  rule.scaling = s.scaling;
  const double route_s = best_seconds(reps, stream, [&] {
    moed::cuda::route_tokens(d_logits.data(), int(T), s.experts, rule, s.sigmoid ? d_bias.data() : nullptr, nullptr,
                             d_ids.data(), d_weights.data(), d_route_counts.data(), stream);
  });
  print_ratio(s.sigmoid ? "routing (route_tokens, sigmoid, groups)" : "routing (route_tokens, softmax)",
              double(T * s.experts * 4 + pairs * 8 + T * 4), route_s, bound);

  // Grouping, then the permute of every pair's row.
  DeviceBuffer<int> d_counts(n_experts), d_offsets(n_experts + 1), d_order(n_pairs), d_token(n_pairs);
  moed::cuda::count_and_offsets(d_ids.data(), int(pairs), s.experts, d_counts.data(), d_offsets.data(),
                                d_order.data(), stream);
  moed::cuda::pair_tokens(d_order.data(), int(pairs), s.top_k, d_token.data(), stream);
  auto x = random_floats(std::size_t(T * H), 2, 1.0f);
  DeviceBuffer<float> d_x(x.size()), d_rows(n_pairs * std::size_t(H));
  d_x.upload(x);
  const double permute_s = best_seconds(reps, stream, [&] {
    moed::cuda::permute_rows(d_x.data(), d_token.data(), int(pairs), int(H), d_rows.data(), stream);
  });
  print_ratio("permute (permute_rows)", double(pairs * H * 8 + pairs * 4), permute_s, bound);

  // Combine: every pair's output onto its token's fixed-point sum.
  DeviceBuffer<long long> d_acc(x.size());
  DeviceBuffer<unsigned long long> d_saturated(1);
  const double combine_s = best_seconds(reps, stream, [&] {
    d_acc.zero(stream);
    moed::cuda::combine_fixed(d_rows.data(), d_weights.data(), d_token.data(), int(pairs), int(H), d_acc.data(),
                              d_saturated.data(), stream);
  });
  // The bytes it must move at least: y read once, each sum zeroed, then read
  // and written once. Its k atomics per sum move more where the sums do not
  // stay in the L2, so this ratio is the kernel's useful rate, not its traffic.
  print_ratio("combine (combine_fixed, least bytes)", double(pairs * H * 4 + T * H * 8 * 3), combine_s, bound);

  // The grouped FFN over equal groups, against one dense GEMM pair of the same FLOPs.
  const int E = std::min(s.experts, 8);  // the experts timed (weights of all 256 would not change the rate)
  const long long rows_each = std::max(1LL, pairs / s.experts);
  std::vector<int> offsets(std::size_t(E) + 1);
  for (int e = 0; e <= E; ++e) offsets[std::size_t(e)] = int(rows_each * e);
  auto w13 = random_floats(std::size_t(2 * F * H), 3, 0.02f), w2 = random_floats(std::size_t(H * F), 4, 0.02f);
  DeviceBuffer<float> d_w13(w13.size()), d_w2(w2.size());
  d_w13.upload(w13);
  d_w2.upload(w2);
  // Every expert reads the same weights: the rate is the GEMMs', not the weights' placement.
  std::vector<const float*> p13(std::size_t(E), d_w13.data()), p2(std::size_t(E), d_w2.data());
  const long long rows = rows_each * E;
  const std::size_t n_rows = std::size_t(rows);
  DeviceBuffer<float> d_scratch(n_rows * std::size_t(2 * F)), d_y(n_rows * std::size_t(H));
  CublasHandle handle(stream);
  const double grouped_s = best_seconds(reps, stream, [&] {
    moed::cuda::expert_ffn_grouped(handle, d_rows.data(), offsets.data(), E, p13.data(), p2.data(), int(H), int(F),
                                   d_scratch.data(), d_y.data(), stream);
  });
  const double dense_s = best_seconds(reps, stream, [&] {
    moed::cuda::detail::gemm_xwt(handle.get(), d_rows.data(), int(rows), int(H), d_w13.data(), int(2 * F),
                                 d_scratch.data(), int(H), CUBLAS_COMPUTE_32F);
    moed::cuda::detail::gemm_xwt(handle.get(), d_scratch.data(), int(rows), int(F), d_w2.data(), int(H), d_y.data(),
                                 int(2 * F), CUBLAS_COMPUTE_32F);
  });
  const double flops = 2.0 * double(rows) * double(H) * double(3 * F);
  std::printf("%-34s %9.1f TFLOP/s  %.3f of dense cuBLAS (%.1f TFLOP/s, same FLOPs, fp32), %lld rows x %d experts\n",
              "grouped FFN fp32 (expert_ffn_grouped)", flops / grouped_s * 1e-12, dense_s / grouped_s,
              flops / dense_s * 1e-12, rows_each, E);
  grouped_tensor_cores(s, d_rows.data(), offsets, w13, w2, reps, handle, stream);
  fixed_order_formats(s, reps, bound, handle, stream);
  // The whole layer at prefill and at decode sizes, in the formats the
  // checkpoints ship (Mixtral: bf16; DeepSeek-V3: fp8).
  const auto dtype = s.sigmoid ? moed::kernels::WeightDtype::fp8 : moed::kernels::WeightDtype::bf16;
  for (const auto products : {moed::cuda::DeviceProducts::f32, moed::cuda::DeviceProducts::bf16})
    for (const long long tokens : {T, 64LL}) layer_tokens_per_second(s, rule, dtype, products, tokens, reps, stream);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  int reps = 10;
  std::string shape = "mixtral";
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--reps" && i + 1 < argc) {
      reps = std::atoi(argv[++i]);
    } else if (arg == "--shape" && i + 1 < argc) {
      shape = argv[++i];
    } else {
      std::fprintf(stderr, "usage: bench_gpu_kernels [--reps N] [--shape mixtral|deepseek|small]\n");
      return 2;
    }
  }
  if (reps < 1) {
    std::fprintf(stderr, "bench_gpu_kernels: --reps must be at least 1\n");
    return 2;
  }
  const Shape* chosen = nullptr;
  for (const Shape& s : kShapes)
    if (shape == s.name) chosen = &s;
  if (!chosen) {
    std::fprintf(stderr, "bench_gpu_kernels: unknown --shape %s (mixtral, deepseek, small)\n", shape.c_str());
    return 2;
  }
  std::string why;
  if (!moed::cuda::gpu_available(&why)) {
    std::fprintf(stderr, "bench_gpu_kernels: no usable GPU: %s\n", why.c_str());
    return 1;
  }
  try {
    return run(*chosen, reps);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_gpu_kernels: %s\n", e.what());
    return 1;
  }
}
