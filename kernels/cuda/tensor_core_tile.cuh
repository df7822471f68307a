// The tensor-core GEMM's block body (kernels/cuda/tensor_core_gemm.cu
// launches it, one block of 128 threads, four warps, per 64 x 64 tile of C).
// A header of its own, as fixed_order_tile.cuh is, so that a host test can
// compile it with the warps' matrix products emulated
// (tests/unit/kernels_cuda/test_tensor_core_emulated.cc): that checks the
// staging, the decoding, fp8's scale blocks and the epilogue here, and only a
// GPU checks the tensor cores themselves.
//
// What it computes (cuda_kernels.h, gemm_tensor_core): the rows rounded to
// bf16, each weight as a bf16 value the tensor cores multiply exactly (the
// code's value; mxfp4 with its power-of-two scale folded in, exact; fp8 and
// int8 unscaled), products summed in fp32 by the tensor cores 16 k steps at
// a time, in k order from +0. fp8: each 128-step scale block summed from +0,
// then C = fma(S, scale, C), block by block; int8: C times the row's scale
// at the end. The k steps are staged 32 at a time on absolute multiples of
// 32 (steps outside [k_begin, k_end) multiply as zeros), so the tiles, the k
// order and the blocks depend on the range and the weights alone: a row's
// bits do not depend on its batch or its position in it.
#pragma once

#include <vector>

#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/fixed_order_tile.cuh"

#if defined(__CUDACC__)
#include <cuda_bf16.h>
#include <mma.h>
#endif

namespace moed::cuda::tensor_detail {

constexpr int kRows = 64, kCols = 64, kStep = 32, kThreads = 128, kWarpTile = 32, kFrag = 16;
constexpr int kLd = kStep + 8;      // bf16 per staged row: a multiple of 8, rows 80 bytes apart
constexpr int kLdc = kCols + 4;     // floats per row of the epilogue's tile
constexpr int kFp8Block = 128;

using gemm_detail::float_bits;
using gemm_detail::float_from_bits;

#if defined(__CUDACC__)
__device__ inline void block_sync() { __syncthreads(); }
#else
void block_sync();  // the host test that includes this defines it
#endif

// fp32 to bf16, rounded to nearest even (NaN kept a quiet NaN of its sign).
MOED_TILE_FUNCTION unsigned short bf16_rn(float f) {
  const unsigned bits = float_bits(f);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<unsigned short>((bits >> 16) | 0x0040u);
  return static_cast<unsigned short>((bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16);
}

// The bf16 value that the tensor cores multiply for weight (j, k): exact in
// every format but f32 (rounded).
MOED_TILE_FUNCTION unsigned short staged_weight(const DeviceMatrix& w, long long j, long long k) {
  const unsigned char* codes = w.codes;
  switch (w.dtype) {
    case DeviceDtype::f32:
      return bf16_rn(reinterpret_cast<const float*>(codes)[j * w.k + k]);
    case DeviceDtype::bf16:
      return reinterpret_cast<const unsigned short*>(codes)[j * w.k + k];
    case DeviceDtype::fp8:
      return bf16_rn(gemm_detail::fp8_value(codes[j * w.k + k]));
    case DeviceDtype::int8:
      return bf16_rn(float(static_cast<signed char>(codes[j * w.k + k])));
    case DeviceDtype::mxfp4: {
      const unsigned byte = codes[j * (w.k / 2) + k / 2];
      return bf16_rn(gemm_detail::mul_rn(gemm_detail::fp4_value(byte >> (4 * (k % 2)) & 15),
                                         gemm_detail::e8m0_value(w.scales[j * (w.k / gemm_detail::kMxBlock) +
                                                                          k / gemm_detail::kMxBlock])));
    }
  }
  return 0;
}

// A block's shared memory: the 32 staged k steps of its 64 rows and 64
// columns (B stored column-major: a column's steps contiguous), and the
// epilogue's tile of sums. 32-byte aligned, as the warps' loads need.
struct TileShared {
  alignas(32) unsigned short a[kRows][kLd];
  alignas(32) unsigned short w[kCols][kLd];
  alignas(32) float c[kRows][kLdc];
};

// A warp's 16 x 16 accumulator and its three operations.
#if defined(__CUDACC__)
using Accumulator = nvcuda::wmma::fragment<nvcuda::wmma::accumulator, kFrag, kFrag, kFrag, float>;
__device__ inline void zero(Accumulator& acc) { nvcuda::wmma::fill_fragment(acc, 0.0f); }
// acc += A[16 x 16] B[16 x 16], A row-major and B column-major in shared memory.
__device__ inline void multiply_add(Accumulator& acc, const unsigned short* a, const unsigned short* b) {
  using namespace nvcuda::wmma;
  fragment<matrix_a, kFrag, kFrag, kFrag, __nv_bfloat16, row_major> fa;
  fragment<matrix_b, kFrag, kFrag, kFrag, __nv_bfloat16, col_major> fb;
  load_matrix_sync(fa, reinterpret_cast<const __nv_bfloat16*>(a), kLd);
  load_matrix_sync(fb, reinterpret_cast<const __nv_bfloat16*>(b), kLd);
  mma_sync(acc, fa, fb, acc);
}
// acc = fma(block, scale, acc) element by element (one scale for the fragment).
__device__ inline void fma_scaled(Accumulator& acc, const Accumulator& block, float scale) {
  for (int i = 0; i < acc.num_elements; ++i) acc.x[i] = __fmaf_rn(block.x[i], scale, acc.x[i]);
}
__device__ inline void store(float* to, const Accumulator& acc, int /*lane*/) {
  nvcuda::wmma::store_matrix_sync(to, acc, kLdc, nvcuda::wmma::mem_row_major);
}
#else
// Emulated: each lane holds the whole fragment (the lanes agree), products
// summed in k order by fma; only lane 0 stores. A stand-in for the tensor
// cores' arithmetic, whose order within 16 steps is the hardware's.
struct Accumulator {
  float x[kFrag][kFrag];
};
inline void zero(Accumulator& acc) {
  for (auto& row : acc.x)
    for (float& v : row) v = 0.0f;
}
inline void multiply_add(Accumulator& acc, const unsigned short* a, const unsigned short* b) {
  for (int r = 0; r < kFrag; ++r)
    for (int c = 0; c < kFrag; ++c)
      for (int kk = 0; kk < kFrag; ++kk)
        acc.x[r][c] = gemm_detail::fma_rn(float_from_bits(unsigned(a[r * kLd + kk]) << 16),
                                          float_from_bits(unsigned(b[c * kLd + kk]) << 16), acc.x[r][c]);
}
inline void fma_scaled(Accumulator& acc, const Accumulator& block, float scale) {
  for (int r = 0; r < kFrag; ++r)
    for (int c = 0; c < kFrag; ++c) acc.x[r][c] = gemm_detail::fma_rn(block.x[r][c], scale, acc.x[r][c]);
}
inline void store(float* to, const Accumulator& acc, int lane) {
  if (lane != 0) return;
  for (int r = 0; r < kFrag; ++r)
    for (int c = 0; c < kFrag; ++c) to[r * kLdc + c] = acc.x[r][c];
}
#endif

// A warp's four fragments += its 32 rows x the 32 staged steps x its 32 columns.
MOED_TILE_FUNCTION void multiply_step(Accumulator (&into)[2][2], const TileShared& shared, int warp_row,
                                      int warp_col) {
#if defined(__CUDACC__)
#pragma unroll
#endif
  for (int half = 0; half < kStep / kFrag; ++half)
    for (int fi = 0; fi < 2; ++fi)
      for (int fj = 0; fj < 2; ++fj)
        multiply_add(into[fi][fj], &shared.a[warp_row + kFrag * fi][kFrag * half],
                     &shared.w[warp_col + kFrag * fj][kFrag * half]);
}

// Thread `tid` of the block that computes tile (tile_x, tile_y) of C: 64
// rows x 64 columns, warp w's quarter 32 x 32 (four fragments).
MOED_TILE_FUNCTION void tensor_tile(int tid, long long tile_x, long long tile_y, TileShared& shared, const float* a,
                                    int m, int lda, const DeviceMatrix& w, long long k_begin, long long k_end,
                                    float* c, int ldc) {
  const long long row0 = tile_y * kRows, col0 = tile_x * kCols;
  const int warp = tid / 32, lane = tid % 32;
  const int warp_row = (warp / 2) * kWarpTile, warp_col = (warp % 2) * kWarpTile;
  const bool fp8 = w.dtype == DeviceDtype::fp8;
  Accumulator acc[2][2], block[2][2];  // block: fp8's current scale block
  for (int fi = 0; fi < 2; ++fi)
    for (int fj = 0; fj < 2; ++fj) {
      zero(acc[fi][fj]);
      zero(block[fi][fj]);
    }
  for (long long k0 = k_begin / kStep * kStep; k0 < k_end; k0 += kStep) {
    for (int i = tid; i < kRows * kStep; i += kThreads) {
      const int r = i / kStep, kk = i % kStep;
      const long long row = row0 + r, k = k0 + kk;
      const bool in = row < m && k >= k_begin && k < k_end;
      shared.a[r][kk] = in ? bf16_rn(a[row * lda + (k - k_begin)]) : 0;
    }
    for (int i = tid; i < kCols * kStep; i += kThreads) {
      const int cc = i / kStep, kk = i % kStep;
      const long long j = col0 + cc, k = k0 + kk;
      shared.w[cc][kk] = j < w.n && k >= k_begin && k < k_end ? staged_weight(w, j, k) : 0;
    }
    block_sync();
    // (Two branches, not a chosen reference: the fragments stay in registers.)
    if (fp8)
      multiply_step(block, shared, warp_row, warp_col);
    else
      multiply_step(acc, shared, warp_row, warp_col);
    block_sync();
    // fp8: a scale block ends (or the range does): its sum scaled into C.
    // The block's 64 columns lie in one 128-row tile of the scales.
    if (fp8 && ((k0 + kStep) % kFp8Block == 0 || k0 + kStep >= k_end)) {
      const long long tiles_per_row = (w.k + kFp8Block - 1) / kFp8Block;
      const float scale =
          reinterpret_cast<const float*>(w.scales)[(col0 / kFp8Block) * tiles_per_row + k0 / kFp8Block];
      for (int fi = 0; fi < 2; ++fi)
        for (int fj = 0; fj < 2; ++fj) {
          fma_scaled(acc[fi][fj], block[fi][fj], scale);
          zero(block[fi][fj]);
        }
    }
  }
  for (int fi = 0; fi < 2; ++fi)
    for (int fj = 0; fj < 2; ++fj)
      store(&shared.c[warp_row + kFrag * fi][warp_col + kFrag * fj], acc[fi][fj], lane);
  block_sync();
  const float* row_scales = reinterpret_cast<const float*>(w.scales);
  for (int i = tid; i < kRows * kCols; i += kThreads) {
    const int r = i / kCols, cc = i % kCols;
    const long long row = row0 + r, j = col0 + cc;
    if (row >= m || j >= w.n) continue;
    const float sum = shared.c[r][cc];
    c[row * ldc + j] = w.dtype == DeviceDtype::int8 ? gemm_detail::mul_rn(sum, row_scales[j]) : sum;
  }
}

// The grouped launches: one block row per 64-row tile of one expert's rows,
// so that every tile is the one gemm_tensor_core would compute for that
// expert alone (the same bits).
struct GroupedTile {
  int expert, tile_y, first_row, rows;  // the expert's rows: [first_row, first_row + rows) of A and C
};

// The tiles of the experts' row groups (host_offsets[experts + 1]), in
// expert order: the order tile_at finds them in (and the tests' reference).
inline std::vector<GroupedTile> grouped_tiles(const int* host_offsets, int experts) {
  std::vector<GroupedTile> tiles;
  for (int e = 0; e < experts; ++e) {
    const int rows = host_offsets[e + 1] - host_offsets[e];
    for (int y = 0; y * kRows < rows; ++y) tiles.push_back({e, y, host_offsets[e], rows});
  }
  return tiles;
}

// Tile `t` of the same list, from the offsets alone (device memory in the
// launch over device offsets): each expert's tiles counted in expert order;
// false past the last tile.
MOED_TILE_FUNCTION bool tile_at(int t, const int* offsets, int experts, GroupedTile& out) {
  int before = 0;
  for (int e = 0; e < experts; ++e) {
    const int rows = offsets[e + 1] - offsets[e], tiles = (rows + kRows - 1) / kRows;
    if (t < before + tiles) {
      out = {e, t - before, offsets[e], rows};
      return true;
    }
    before += tiles;
  }
  return false;
}

// Thread `tid` of the block computing column tile `tile_x` of `tile`.
MOED_TILE_FUNCTION void grouped_tile(int tid, long long tile_x, const GroupedTile& tile, TileShared& shared,
                                     const float* a, int lda, const DeviceMatrix* w, long long k_begin,
                                     long long k_end, float* c, int ldc) {
  tensor_tile(tid, tile_x, tile.tile_y, shared, a + static_cast<long long>(tile.first_row) * lda, tile.rows, lda,
              w[tile.expert], k_begin, k_end, c + static_cast<long long>(tile.first_row) * ldc, ldc);
}

}  // namespace moed::cuda::tensor_detail
