// The fixed-order GEMM's block body (kernels/cuda/fixed_order_gemm.cu
// launches it, one block of 256 threads per tile of C). A header of its own
// so that a host test can also compile it and run each block as 256 threads
// meeting at a barrier (tests/unit/kernels_cuda/test_gemm_emulated.cc),
// holding it to kernels/cpu's GEMM where no GPU is. Every multiply and fma
// is an explicit round-to-nearest operation on both sides (CUDA's _rn
// intrinsics; on the host, one IEEE operation each: std::fma, and a plain
// multiply in ISO C++, which contracts nothing).
#pragma once

#include <cmath>
#include <cstring>

#include "kernels/cuda/cuda_kernels.h"

#if defined(__CUDACC__)
#define MOED_TILE_FUNCTION __device__ inline
#else
#define MOED_TILE_FUNCTION inline
#endif

namespace moed::cuda::gemm_detail {

#if defined(__CUDACC__)
__device__ inline float float_from_bits(unsigned bits) { return __uint_as_float(bits); }
__device__ inline unsigned float_bits(float f) { return __float_as_uint(f); }
__device__ inline float mul_rn(float a, float b) { return __fmul_rn(a, b); }
__device__ inline float fma_rn(float a, float b, float c) { return __fmaf_rn(a, b, c); }
__device__ inline void block_sync() { __syncthreads(); }
#else
inline float float_from_bits(unsigned bits) {
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}
inline unsigned float_bits(float f) {
  unsigned bits;
  std::memcpy(&bits, &f, sizeof bits);
  return bits;
}
inline float mul_rn(float a, float b) { return a * b; }
inline float fma_rn(float a, float b, float c) { return std::fma(a, b, c); }
// The block's barrier: the host test that includes this defines it.
void block_sync();
#endif

constexpr int kTileRows = 16, kTileCols = 64, kTileK = 32, kThreads = 256;
constexpr int kRowsPerThread = kTileRows * kTileCols / kThreads;  // 4
constexpr int kFp8Tile = 128, kMxBlock = 32;
constexpr unsigned kQuietNaN = 0x7fc00000u;

// kernels/cpu/weight_codes.cc's conversions, bit for bit (the magnitude's
// bits moved into an fp32's fields, then one exact power-of-two multiply).
MOED_TILE_FUNCTION float fp8_value(unsigned code) {
  if ((code & 0x7f) == 0x7f) return float_from_bits(kQuietNaN);
  const float magnitude = mul_rn(float_from_bits((code & 0x7f) << 20), 0x1p120f);
  return code & 0x80 ? -magnitude : magnitude;
}

MOED_TILE_FUNCTION float fp4_value(unsigned nibble) {
  const float magnitude = mul_rn(float_from_bits((nibble & 7) << 22), 0x1p126f);
  return nibble & 8 ? -magnitude : magnitude;
}

MOED_TILE_FUNCTION float e8m0_value(unsigned e) {
  if (e == 255) return float_from_bits(kQuietNaN);
  return e == 0 ? 0x1p-127f : float_from_bits(e << 23);
}

// EncodedMatrix::value(i, j).
MOED_TILE_FUNCTION float weight_value(const DeviceMatrix& w, long long i, long long j) {
  const unsigned char* codes = w.codes;
  const float* fscales = reinterpret_cast<const float*>(w.scales);
  switch (w.dtype) {
    case DeviceDtype::f32:
      return reinterpret_cast<const float*>(codes)[i * w.k + j];
    case DeviceDtype::bf16:
      return float_from_bits(unsigned(reinterpret_cast<const unsigned short*>(codes)[i * w.k + j]) << 16);
    case DeviceDtype::fp8: {
      const long long tiles_per_row = (w.k + kFp8Tile - 1) / kFp8Tile;
      return mul_rn(fp8_value(codes[i * w.k + j]), fscales[(i / kFp8Tile) * tiles_per_row + j / kFp8Tile]);
    }
    case DeviceDtype::int8:
      return mul_rn(float(static_cast<signed char>(codes[i * w.k + j])), fscales[i]);
    case DeviceDtype::mxfp4: {
      const unsigned byte = codes[i * (w.k / 2) + j / 2];
      return mul_rn(fp4_value(byte >> (4 * (j % 2)) & 15), e8m0_value(w.scales[i * (w.k / kMxBlock) + j / kMxBlock]));
    }
  }
  return 0.0f;
}

// A block's shared memory: the tile's activations and decoded weights,
// padded so that a warp's stores (one row's 32 k) hit 32 banks.
struct TileShared {
  float a[kTileK][kTileRows + 1];
  float w[kTileK][kTileCols + 1];
};

// Thread `tid` of the block that computes tile (tile_x, tile_y) of C: 16
// rows x 64 columns. Per step of 32 k it stages the rows' activations and
// the columns' decoded weight values in shared memory; then each thread
// continues, in k order, the chains of its column for 4 rows. The chains
// live in registers across steps and run over exactly [k_begin, k_end): no
// padding term ever enters one.

MOED_TILE_FUNCTION void gemm_tile(int tid, long long tile_x, long long tile_y, TileShared& shared, const float* a,
                                  int m, int lda, const DeviceMatrix& w, long long k_begin, long long k_end, float* c,
                                  int ldc) {
  auto& tile_a = shared.a;
  auto& tile_w = shared.w;
  const long long row0 = tile_y * kTileRows;
  const long long col0 = tile_x * kTileCols;
  const int col = tid % kTileCols, row_base = tid / kTileCols;
  float acc[kRowsPerThread];
  for (int q = 0; q < kRowsPerThread; ++q) acc[q] = 0.0f;
  for (long long k0 = k_begin; k0 < k_end; k0 += kTileK) {
    const int steps = int(k_end - k0 < kTileK ? k_end - k0 : kTileK);
    for (int i = tid; i < kTileRows * kTileK; i += kThreads) {
      const int r = i / kTileK, kk = i % kTileK;
      const long long row = row0 + r;
      tile_a[kk][r] = row < m && kk < steps ? a[row * lda + (k0 - k_begin) + kk] : 0.0f;
    }
    for (int i = tid; i < kTileCols * kTileK; i += kThreads) {
      const int cc = i / kTileK, kk = i % kTileK;
      const long long j = col0 + cc;
      tile_w[kk][cc] = j < w.n && kk < steps ? weight_value(w, j, k0 + kk) : 0.0f;
    }
    block_sync();
    for (int kk = 0; kk < steps; ++kk) {
      const float value = tile_w[kk][col];
      for (int q = 0; q < kRowsPerThread; ++q)
        acc[q] = fma_rn(tile_a[kk][row_base + q * (kThreads / kTileCols)], value, acc[q]);
    }
    block_sync();
  }
  const long long j = col0 + col;
  if (j >= w.n) return;
  for (int q = 0; q < kRowsPerThread; ++q) {
    const long long row = row0 + row_base + q * (kThreads / kTileCols);
    if (row < m) c[row * ldc + j] = acc[q];
  }
}

}  // namespace moed::cuda::gemm_detail
