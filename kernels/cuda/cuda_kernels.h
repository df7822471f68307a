// The GPU kernels of moed: the same steps as kernels/cpu/, on one CUDA device.
//
// On the CUDA runtime and cuBLAS, and the header-only element functions it
// shares with kernels/cpu (C++17), so that it builds with nvcc apart from the
// rest of the project. Every operation is asynchronous on
// the stream it is given; pointers are device pointers unless stated.
//
// Determinism: every kernel here has a fixed reduction order that does not
// depend on the launch configuration or on timing, so the same inputs give the
// same bits on every run. Atomics are used only on integers (counts, the
// fixed-point combine), where addition is associative.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "kernels/cpu/router_body.h"
#include "kernels/cuda/gpu_probe.h"

namespace moed::cuda {

// ---- errors -----------------------------------------------------------------

// A failed CUDA runtime or cuBLAS call: where, which call, and the library's
// error name and text, e.g. "device.cu:42: cudaMalloc(...) failed:
// cudaErrorMemoryAllocation (out of memory)".
class CudaError : public std::runtime_error {
 public:
  CudaError(const char* file, int line, const std::string& message);
  const char* file() const noexcept { return file_; }
  int line() const noexcept { return line_; }

 private:
  const char* file_;
  int line_;
};

namespace detail {
[[noreturn]] void throw_cuda(cudaError_t status, const char* expr, const char* file, int line);
[[noreturn]] void throw_cublas(cublasStatus_t status, const char* expr, const char* file, int line);
inline void check(cudaError_t status, const char* expr, const char* file, int line) {
  if (status != cudaSuccess) throw_cuda(status, expr, file, line);
}
inline void check(cublasStatus_t status, const char* expr, const char* file, int line) {
  if (status != CUBLAS_STATUS_SUCCESS) throw_cublas(status, expr, file, line);
}
// Blocks for a grid-stride loop over n items: one item per thread, capped
// at 2^20 blocks (the loop covers the rest).
inline unsigned grid_blocks(long long n, int threads) {
  long long b = (n + threads - 1) / threads;
  return unsigned(b < 1 ? 1 : (b > (1 << 20) ? (1 << 20) : b));
}
// Row-major C[m, n] = A[m, k] · W[n, k]ᵀ (kernels/cpu/gemm.h's gemm_xwt; A's
// rows lda apart) on the handle's stream, fp32 in and out. Defined in cublas.cu.
void gemm_xwt(cublasHandle_t handle, const float* a, int m, int k, const float* w, int n, float* c,
              int lda, cublasComputeType_t compute);
}  // namespace detail

// Throws CudaError when a cudaError_t or cublasStatus_t expression fails.
#define MOED_CUDA_CHECK(expr) ::moed::cuda::detail::check((expr), #expr, __FILE__, __LINE__)

// gpu_available(): kernels/cuda/gpu_probe.h.

// ---- RAII -------------------------------------------------------------------

// n elements of T in device memory (cudaMalloc); move-only.
template <class T>
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(std::size_t n) : n_(n) {
    if (n) MOED_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&p_), n * sizeof(T)));
  }
  ~DeviceBuffer() { reset(); }
  DeviceBuffer(DeviceBuffer&& o) noexcept : p_(std::exchange(o.p_, nullptr)), n_(std::exchange(o.n_, 0)) {}
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    if (this != &o) {
      reset();
      p_ = std::exchange(o.p_, nullptr);
      n_ = std::exchange(o.n_, 0);
    }
    return *this;
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  T* data() noexcept { return p_; }
  const T* data() const noexcept { return p_; }
  std::size_t size() const noexcept { return n_; }

  // Blocking copies (cudaMemcpy), for setup and tests: they wait for the
  // device, so issue them after the kernels that produce the data.
  void upload(const T* host, std::size_t n) {
    if (n > n_) throw std::out_of_range("DeviceBuffer::upload: more elements than the buffer holds");
    if (n) MOED_CUDA_CHECK(cudaMemcpy(p_, host, n * sizeof(T), cudaMemcpyHostToDevice));
  }
  void upload(const std::vector<T>& host) { upload(host.data(), host.size()); }
  std::vector<T> download() const {
    std::vector<T> host(n_);
    if (n_) MOED_CUDA_CHECK(cudaMemcpy(host.data(), p_, n_ * sizeof(T), cudaMemcpyDeviceToHost));
    return host;
  }
  // All bytes zero, on `stream`.
  void zero(cudaStream_t stream) {
    if (n_) MOED_CUDA_CHECK(cudaMemsetAsync(p_, 0, n_ * sizeof(T), stream));
  }

 private:
  void reset() noexcept {
    if (p_) cudaFree(p_);  // an error here cannot be reported from a destructor
    p_ = nullptr;
    n_ = 0;
  }
  T* p_ = nullptr;
  std::size_t n_ = 0;
};

// A CUDA stream (cudaStreamCreate); move-only.
class Stream {
 public:
  Stream();
  ~Stream();
  Stream(Stream&& o) noexcept : s_(std::exchange(o.s_, nullptr)) {}
  Stream& operator=(Stream&& o) noexcept;
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;

  cudaStream_t get() const noexcept { return s_; }
  operator cudaStream_t() const noexcept { return s_; }
  void synchronize() const;

 private:
  cudaStream_t s_ = nullptr;
};

// A cuBLAS handle bound to a stream; move-only. Math mode CUBLAS_DEFAULT_MATH:
// fp32 GEMMs stay fp32 (no TF32 tensor cores, no bf16x9 emulation).
class CublasHandle {
 public:
  explicit CublasHandle(cudaStream_t stream = nullptr);
  ~CublasHandle();
  CublasHandle(CublasHandle&& o) noexcept : h_(std::exchange(o.h_, nullptr)) {}
  CublasHandle& operator=(CublasHandle&& o) noexcept;
  CublasHandle(const CublasHandle&) = delete;
  CublasHandle& operator=(const CublasHandle&) = delete;

  cublasHandle_t get() const noexcept { return h_; }
  void set_stream(cudaStream_t stream);
  cudaStream_t stream() const;

 private:
  cublasHandle_t h_ = nullptr;
};

// ---- kernels ----------------------------------------------------------------

// out = x / sqrt(mean(x²) + eps) * weight, per row of `hidden` floats (x and out
// may alias), with kernels::rms_norm's bits: the squares summed in double in
// column order, the CPU's expressions after. One warp per row.
void rms_norm(const float* x, const float* weight, int rows, int hidden, float eps, float* out,
              cudaStream_t stream);

// rows[t, e] += bias[e] for t < count, e < width (gpt-oss's router bias on the logits).
void add_row_bias(float* rows, int count, int width, const float* bias, cudaStream_t stream);

// logits[tokens, experts] = x[tokens, hidden] · gate_wᵀ, gate_w [experts, hidden]
// row-major. fp32 arithmetic throughout (CUBLAS_COMPUTE_32F_PEDANTIC: never
// TF32), on the handle's stream.
void gate_logits(CublasHandle& handle, const float* x, const float* gate_w, int tokens, int hidden,
                 int experts, float* logits);

// Each token's experts and weights from logits[tokens, experts], as
// runtime::route chooses them for `rule` (RouterParams::rule()): softmax or
// sigmoid scores in double, the selection bias (selection_bias, [experts],
// device, or null), group-limited selection, top-k or top-p, ties to the
// lower id and NaN last, the weights renormalised and scaled. The same
// element functions and sums in the same order (kernels/cpu/router_body.h),
// so the same ids and weight bits as the CPU's router. With `adjust`
// ([tokens, experts] doubles, device, or null), the router policies'
// selection adjustment as runtime::rank_experts takes it (then choose): the
// softmax of logits + adjust, or sigmoid scores + bias + adjust, for the
// selection; the weights from the unadjusted scores. Writes expert_ids and
// weights [tokens, route_width(rule, experts)] in rank order, padded with -1
// and 0 past each token's count (counts[tokens]: top-p's k varies). No limit
// on k; the experts are limited by shared memory (16 bytes each: about
// 14,000 on Hopper). One warp per token.
void route_tokens(const float* logits, int tokens, int experts, const kernels::RouteRule& rule,
                  const float* selection_bias, const double* adjust, int* expert_ids, float* weights, int* counts,
                  cudaStream_t stream);

// Stable grouping of (token, expert) pairs by expert. expert_ids[pairs] (e.g.
// route_tokens's [tokens, k] read flat); ids outside [0, experts) (e.g. -1 for
// "not here") are left out. Writes counts[experts], offsets[experts + 1]
// (exclusive prefix sum, offsets[experts] = pairs kept) and order[offsets[experts]]:
// the kept pair indices sorted by expert, ascending pair index within an expert.
// Cost: O(pairs) plus O(pairs * experts) reads served from L2.
void count_and_offsets(const int* expert_ids, int pairs, int experts, int* counts, int* offsets,
                       int* order, cudaStream_t stream);

// token[i] = order[i] / k: the token of each grouped pair when pairs are
// numbered token * k + slot (route_tokens's layout).
void pair_tokens(const int* order, int n, int k, int* token, cudaStream_t stream);

// dst[i, :] = src[row_index[i], :] for i < n, rows of `hidden` floats.
void permute_rows(const float* src, const int* row_index, int n, int hidden, float* dst,
                  cudaStream_t stream);

// The gated activation between an FFN's projections (kernels/cpu/expert_ffn.h's
// ExpertActivation): silu(g) u, or gpt-oss's clamped SwiGLU.
struct GatedActivation {
  bool clamped = false;
  float alpha = 1.702f, limit = 7.0f;
};

// In place on rows of h13 = [W1 x | W3 x] (2F floats each): the first F
// columns become act(W1 x, W3 x), element by element with the CPU's element
// functions (kernels/cpu/activation_body.h) and no fma contraction: the same
// bits as kernels::silu_mul and kernels::clamped_swiglu.
void gated_activation(float* h13, long long rows, int ffn, const GatedActivation& activation, cudaStream_t stream);
// The same on rows [row_range[0], row_range[1]) (device memory), at most max_rows of them.
void gated_activation_rows(float* h13, const int* row_range, long long max_rows, int ffn,
                           const GatedActivation& activation, cudaStream_t stream);

// The gated FFN of every expert on its group of rows (kernels/cpu/expert_ffn.h):
// rows [host_offsets[e], host_offsets[e+1]) of x belong to expert e;
// y = W2 · act(W1 x, W3 x) (gated_activation). host_offsets ([experts + 1]), w13 and w2
// (arrays of device pointers, [2F, H] and [H, F] row-major) are host memory.
// scratch is [host_offsets[experts], 2F] floats, indexed by row like x and y.
// One GEMM per expert and phase: a row's bits depend on its expert's row count
// (cuBLAS picks kernels by shape), as on the CPU. Binds `handle` to `stream`.
void expert_ffn_grouped(CublasHandle& handle, const float* x, const int* host_offsets, int experts,
                        const float* const* w13, const float* const* w2, int hidden, int ffn,
                        float* scratch, float* y, cudaStream_t stream, const GatedActivation& activation = {});

// ---- weights in their resident format, and the fixed-order GEMM ------------------

// kernels::WeightDtype's formats, in its order (kernels/cpu/weight_codes.h).
enum class DeviceDtype { f32, bf16, fp8, mxfp4, int8 };

// A weight matrix [n, k] in device memory, laid out as kernels/cpu/encoded_matrix.h
// lays it (and as a migrated slot travels): the codes row-major, then the
// scales (fp8: an fp32 per 128 x 128 tile; int8: an fp32 per row; mxfp4: an
// e8m0 byte per 32 weights of a row; f32 and bf16: none). codes 4-byte aligned.
struct DeviceMatrix {
  DeviceDtype dtype = DeviceDtype::f32;
  long long n = 0, k = 0;
  const unsigned char* codes = nullptr;
  const unsigned char* scales = nullptr;
};

// C[m, n] (row stride ldc) = A · W[:, k_begin:k_end]ᵀ, A's column 0 being W's
// column k_begin (row stride lda). Each element is the chain
// acc = fma(a, value, acc) over the range in k order from +0, with each
// weight's value as EncodedMatrix::value computes it (one exact conversion,
// at most one fp32 multiply): the bits of kernels/cpu's gemm_fixed_order_range
// with fp32 products, whatever m, the row's position or the launch.
void gemm_fixed_order(const float* a, int m, int lda, const DeviceMatrix& w, long long k_begin, long long k_end,
                      float* c, int ldc, cudaStream_t stream);

// The same product on the tensor cores: the rows rounded to bf16, each
// weight's code value in bf16 (exact; mxfp4 with its scale folded in),
// products summed in fp32 16 k steps at a time in k order from +0 (fp8:
// each 128-step scale block from +0, then C = fma(S, scale, C); int8: times
// the row's scale at the end): kernels/cpu's bf16 products within fp32
// rounding, not its bits. Fixed 64 x 64 tiles and k order: a row's bits
// depend on the row, W and the k range alone (tensor_core_tile.cuh).
void gemm_tensor_core(const float* a, int m, int lda, const DeviceMatrix& w, long long k_begin, long long k_end,
                      float* c, int ldc, cudaStream_t stream);

// What the grouped launches from host offsets keep on the device between
// calls: the offsets, the experts' matrices and biases, and the FFN's row
// range (each grown to the largest call, never shrunk).
struct GroupedScratch {
  DeviceBuffer<unsigned char> offsets, w13, w2, b13, b2, row_range;
};

// gemm_tensor_core for many experts in one launch: rows
// [host_offsets[e], host_offsets[e + 1]) of A (row stride lda) times
// host_matrices[e] (every one of the same n) into the same rows of C. Each
// row's bits are those of gemm_tensor_core on its expert alone. The offsets
// and matrices go to the scratch, then as gemm_tensor_core_grouped_device.
void gemm_tensor_core_grouped(const float* a, int lda, const int* host_offsets, int experts,
                              const DeviceMatrix* host_matrices, long long k_begin, long long k_end, float* c,
                              int ldc, GroupedScratch& scratch, cudaStream_t stream);

// The same from offsets in device memory (device_offsets[experts + 1], as
// count_and_offsets writes them), so that no copy to the host stands between
// the grouping and the experts and a whole layer can be captured in a CUDA
// graph: max_rows bounds offsets[experts] - offsets[0] (the launch covers
// max_rows / 64 + experts tiles; those past the last leave at once);
// device_matrices[experts] in device memory, each of n columns. The same
// bits as gemm_tensor_core on each expert alone.
void gemm_tensor_core_grouped_device(const float* a, int lda, const int* device_offsets, int experts, int max_rows,
                                     const DeviceMatrix* device_matrices, long long n, long long k_begin,
                                     long long k_end, float* c, int ldc, cudaStream_t stream);

// Which products an expert's GEMMs take: fp32 on CUDA cores (gemm_fixed_order,
// the CPU's bits) or bf16 on the tensor cores (gemm_tensor_core; f32 weights
// keep fp32 products).
enum class DeviceProducts { f32, bf16 };
void gemm_with(DeviceProducts products, const float* a, int m, int lda, const DeviceMatrix& w, long long k_begin,
               long long k_end, float* c, int ldc, cudaStream_t stream);

namespace detail {
// rows[r, j] += bias[j] for j < width, r < m (row stride `stride`): one fp32 add, as the CPU's add_bias.
void add_bias(float* rows, long long m, int width, long long stride, const float* bias, cudaStream_t stream);
// Throws std::invalid_argument naming `what` and the first bad argument.
void check_gemm_arguments(const char* what, int m, int lda, const DeviceMatrix& w, long long k_begin,
                          long long k_end, int ldc);
}  // namespace detail

// One expert (or shard) in device memory, as kernels::ExpertView holds it on
// the CPU: W1|W3 [2F, H] and W2 [H, F] in their format, the optional biases
// (gpt-oss: b13 [2F] after the up-projection, b2 [H] after chunk 0's
// down-projection), F cut into `chunks` canonical chunks.
struct DeviceExpert {
  DeviceMatrix w13, w2;
  const float* b13 = nullptr;
  const float* b2 = nullptr;
  int hidden = 0, ffn = 0, chunks = 1;
  GatedActivation activation;
  DeviceProducts products = DeviceProducts::f32;
};

// kernels/cpu/expert_ffn.h's expert_ffn_up and expert_ffn_down_chunk on the
// GPU, with the same bits as the CPU's fp32 products (with e.products bf16:
// gemm_tensor_core's, within its tolerance): h13 [m, 2F] =
// act(x · W13ᵀ + b13) in its first F columns; y [m, H] = chunk c of the
// down-projection (plus b2 for chunk 0).
void expert_ffn_up_fixed(const DeviceExpert& e, const float* x, int m, float* h13, cudaStream_t stream);
void expert_ffn_down_chunk_fixed(const DeviceExpert& e, const float* h13, int m, int chunk, float* y,
                                 cudaStream_t stream);

// Every expert's gated FFN on its group of rows of x [rows, H] with bf16
// products on the tensor cores, in three grouped launches (up-projections,
// the activation over every row, down-projections) and the biases: y's rows
// are expert_ffn_up_fixed then expert_ffn_down_chunk_fixed's with products
// bf16 and one chunk, bit for bit. host_experts[experts] (host memory) share
// H, F and the activation; h13 is [rows, 2F] scratch.
void expert_ffn_grouped_tensor(const float* x, const int* host_offsets, int experts, const DeviceExpert* host_experts,
                               float* h13, float* y, GroupedScratch& scratch, cudaStream_t stream);

// A layer's experts for expert_ffn_grouped_tensor_device, all in device
// memory: each expert's W13 and W2, its biases (arrays of device pointers,
// null entries for none, or null arrays), and two ints of scratch.
struct DeviceGroupedExperts {
  int count = 0, hidden = 0, ffn = 0;
  const DeviceMatrix* w13 = nullptr;
  const DeviceMatrix* w2 = nullptr;
  const float* const* b13 = nullptr;
  const float* const* b2 = nullptr;
  GatedActivation activation;
  int* row_range_scratch = nullptr;
};

// expert_ffn_grouped_tensor with the offsets in device memory (as
// gemm_tensor_core_grouped_device): the same bits, no host round trip.
void expert_ffn_grouped_tensor_device(const float* x, const int* device_offsets, int max_rows,
                                      const DeviceGroupedExperts& experts, float* h13, float* y, cudaStream_t stream);

// The fixed-point combine (kernels/cpu/fixed_combine.h): for each pair p and
// column i, acc[pair_token[p], i] += round(gate_weight[p] * y[p, i] * 2^32),
// finite terms saturated at ±2^62 and counted in *saturated (unless null;
// the caller zeroes it), a NaN or inf term making the element INT64_MIN
// (kFixedNaN), which stays so. acc is [tokens, hidden]; pairs with a
// negative pair_token are skipped. Integer atomics (wrapping, as on the
// CPU): the result has the same bits in any order.
void combine_fixed(const float* y, const float* gate_weight, const int* pair_token, int pairs,
                   int hidden, long long* acc, unsigned long long* saturated, cudaStream_t stream);

// out = fp32(double(x) + double(acc) * 2^-32), the residual add, rounded once,
// NaN where acc is kFixedNaN (bit-identical to the CPU's residual_from_fixed).
void residual_from_fixed(const float* x, const long long* acc, int tokens, int hidden, float* out,
                         cudaStream_t stream);

}  // namespace moed::cuda
