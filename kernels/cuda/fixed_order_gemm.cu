// The fixed-order GEMM on the GPU over weights in their resident format, and
// the expert FFN built on it: every output element is kernels/cpu's fma chain
// in k order over the weights' values (kernels/cpu/fixed_order_gemm.h,
// encoded_matrix.h), so a row's bits match the CPU's fp32 products and do not
// depend on its batch. Each multiply, add and fma is an explicit _rn
// intrinsic: nothing is contracted or reassociated, whatever nvcc's flags.
#include <string>

#include "kernels/cuda/cuda_kernels.h"

namespace moed::cuda {

namespace {

constexpr int kTileRows = 16, kTileCols = 64, kTileK = 32, kThreads = 256;
constexpr int kRowsPerThread = kTileRows * kTileCols / kThreads;  // 4
constexpr int kFp8Tile = 128, kMxBlock = 32;
constexpr unsigned kQuietNaN = 0x7fc00000u;

__device__ float bits_to_float(unsigned bits) { return __uint_as_float(bits); }

// kernels/cpu/weight_codes.cc's conversions, bit for bit (the magnitude's
// bits moved into an fp32's fields, then one exact power-of-two multiply).
__device__ float fp8_value(unsigned code) {
  if ((code & 0x7f) == 0x7f) return bits_to_float(kQuietNaN);
  const float magnitude = __fmul_rn(bits_to_float((code & 0x7f) << 20), 0x1p120f);
  return code & 0x80 ? -magnitude : magnitude;
}

__device__ float fp4_value(unsigned nibble) {
  const float magnitude = __fmul_rn(bits_to_float((nibble & 7) << 22), 0x1p126f);
  return nibble & 8 ? -magnitude : magnitude;
}

__device__ float e8m0_value(unsigned e) {
  if (e == 255) return bits_to_float(kQuietNaN);
  return e == 0 ? 0x1p-127f : bits_to_float(e << 23);
}

// EncodedMatrix::value(i, j).
__device__ float weight_value(const DeviceMatrix& w, long long i, long long j) {
  const unsigned char* codes = w.codes;
  const float* fscales = reinterpret_cast<const float*>(w.scales);
  switch (w.dtype) {
    case DeviceDtype::f32:
      return reinterpret_cast<const float*>(codes)[i * w.k + j];
    case DeviceDtype::bf16:
      return bits_to_float(unsigned(reinterpret_cast<const unsigned short*>(codes)[i * w.k + j]) << 16);
    case DeviceDtype::fp8: {
      const long long tiles_per_row = (w.k + kFp8Tile - 1) / kFp8Tile;
      return __fmul_rn(fp8_value(codes[i * w.k + j]), fscales[(i / kFp8Tile) * tiles_per_row + j / kFp8Tile]);
    }
    case DeviceDtype::int8:
      return __fmul_rn(float(static_cast<signed char>(codes[i * w.k + j])), fscales[i]);
    case DeviceDtype::mxfp4: {
      const unsigned byte = codes[i * (w.k / 2) + j / 2];
      return __fmul_rn(fp4_value(byte >> (4 * (j % 2)) & 15), e8m0_value(w.scales[i * (w.k / kMxBlock) + j / kMxBlock]));
    }
  }
  return 0.0f;
}

// A block computes a tile of 16 rows x 64 columns of C. Per step of 32 k it
// stages the rows' activations and the columns' decoded weight values in
// shared memory; then each thread continues, in k order, the chains of its
// column for 4 rows. The chains live in registers across steps and run over
// exactly [k_begin, k_end): no padding term ever enters one.
__global__ void __launch_bounds__(kThreads)
    gemm_fixed_order_kernel(const float* a, int m, int lda, DeviceMatrix w, long long k_begin, long long k_end,
                            float* c, int ldc) {
  __shared__ float tile_a[kTileK][kTileRows + 1];  // padded: a warp's stores, one row's 32 k, hit 32 banks
  __shared__ float tile_w[kTileK][kTileCols + 1];
  const long long row0 = static_cast<long long>(blockIdx.y) * kTileRows;
  const long long col0 = static_cast<long long>(blockIdx.x) * kTileCols;
  const int col = threadIdx.x % kTileCols, row_base = threadIdx.x / kTileCols;
  float acc[kRowsPerThread];
  for (int q = 0; q < kRowsPerThread; ++q) acc[q] = 0.0f;
  for (long long k0 = k_begin; k0 < k_end; k0 += kTileK) {
    const int steps = int(k_end - k0 < kTileK ? k_end - k0 : kTileK);
    for (int i = threadIdx.x; i < kTileRows * kTileK; i += kThreads) {
      const int r = i / kTileK, kk = i % kTileK;
      const long long row = row0 + r;
      tile_a[kk][r] = row < m && kk < steps ? a[row * lda + (k0 - k_begin) + kk] : 0.0f;
    }
    for (int i = threadIdx.x; i < kTileCols * kTileK; i += kThreads) {
      const int cc = i / kTileK, kk = i % kTileK;
      const long long j = col0 + cc;
      tile_w[kk][cc] = j < w.n && kk < steps ? weight_value(w, j, k0 + kk) : 0.0f;
    }
    __syncthreads();
    for (int kk = 0; kk < steps; ++kk) {
      const float value = tile_w[kk][col];
      for (int q = 0; q < kRowsPerThread; ++q)
        acc[q] = __fmaf_rn(tile_a[kk][row_base + q * (kThreads / kTileCols)], value, acc[q]);
    }
    __syncthreads();
  }
  const long long j = col0 + col;
  if (j >= w.n) return;
  for (int q = 0; q < kRowsPerThread; ++q) {
    const long long row = row0 + row_base + q * (kThreads / kTileCols);
    if (row < m) c[row * ldc + j] = acc[q];
  }
}

// rows[r, j] += bias[j] for j < width (row stride `stride`): one IEEE add, as the CPU's add_bias.
__global__ void add_bias_kernel(float* rows, long long m, int width, long long stride, const float* bias) {
  const long long n = m * width;
  for (long long i = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<long long>(gridDim.x) * blockDim.x) {
    const long long r = i / width, j = i % width;
    rows[r * stride + j] = __fadd_rn(rows[r * stride + j], bias[j]);
  }
}

void add_bias(float* rows, long long m, int width, long long stride, const float* bias, cudaStream_t stream) {
  if (m == 0 || width == 0) return;
  add_bias_kernel<<<detail::grid_blocks(m * width, kThreads), kThreads, 0, stream>>>(rows, m, width, stride, bias);
  MOED_CUDA_CHECK(cudaGetLastError());
}

void check_matrix(const DeviceMatrix& w, const char* what) {
  if (w.n < 1 || w.k < 1 || !w.codes)
    throw std::invalid_argument(std::string(what) + ": an empty weight matrix");
  const bool scaled = w.dtype == DeviceDtype::fp8 || w.dtype == DeviceDtype::int8 || w.dtype == DeviceDtype::mxfp4;
  if (scaled && !w.scales) throw std::invalid_argument(std::string(what) + ": a scaled format without its scales");
  if (w.dtype == DeviceDtype::mxfp4 && w.k % kMxBlock != 0)
    throw std::invalid_argument(std::string(what) + ": mxfp4 needs k a multiple of 32, got " + std::to_string(w.k));
}

}  // namespace

void gemm_fixed_order(const float* a, int m, int lda, const DeviceMatrix& w, long long k_begin, long long k_end,
                      float* c, int ldc, cudaStream_t stream) {
  check_matrix(w, "gemm_fixed_order");
  if (m < 0 || k_begin < 0 || k_end > w.k || k_begin > k_end || lda < k_end - k_begin || ldc < w.n)
    throw std::invalid_argument("gemm_fixed_order: bad sizes (m " + std::to_string(m) + ", k range [" +
                                std::to_string(k_begin) + ", " + std::to_string(k_end) + ") of " +
                                std::to_string(w.k) + ", lda " + std::to_string(lda) + ", ldc " + std::to_string(ldc) +
                                ")");
  if (m == 0) return;
  const dim3 grid(unsigned((w.n + kTileCols - 1) / kTileCols), unsigned((m + kTileRows - 1) / kTileRows));
  if (grid.y > 65535u) throw std::invalid_argument("gemm_fixed_order: more than 65535 x 16 rows in one call");
  gemm_fixed_order_kernel<<<grid, kThreads, 0, stream>>>(a, m, lda, w, k_begin, k_end, c, ldc);
  MOED_CUDA_CHECK(cudaGetLastError());
}

void expert_ffn_up_fixed(const DeviceExpert& e, const float* x, int m, float* h13, cudaStream_t stream) {
  const long long F2 = 2LL * e.ffn;
  if (e.w13.n != F2 || e.w13.k != e.hidden)
    throw std::invalid_argument("expert_ffn_up_fixed: W13 is not [2F, H]");
  gemm_fixed_order(x, m, e.hidden, e.w13, 0, e.hidden, h13, int(F2), stream);
  if (e.b13) add_bias(h13, m, int(F2), F2, e.b13, stream);
  gated_activation(h13, m, e.ffn, e.activation, stream);
}

void expert_ffn_down_chunk_fixed(const DeviceExpert& e, const float* h13, int m, int chunk, float* y,
                                 cudaStream_t stream) {
  if (e.chunks < 1 || e.ffn % e.chunks != 0 || chunk < 0 || chunk >= e.chunks)
    throw std::invalid_argument("expert_ffn_down_chunk_fixed: chunk " + std::to_string(chunk) + " of " +
                                std::to_string(e.chunks) + " over an F of " + std::to_string(e.ffn));
  if (e.w2.n != e.hidden || e.w2.k != e.ffn) throw std::invalid_argument("expert_ffn_down_chunk_fixed: W2 is not [H, F]");
  const long long width = e.ffn / e.chunks, first = chunk * width;
  gemm_fixed_order(h13 + first, m, 2 * e.ffn, e.w2, first, first + width, y, e.hidden, stream);
  if (e.b2 && chunk == 0) add_bias(y, m, e.hidden, e.hidden, e.b2, stream);
}

}  // namespace moed::cuda
