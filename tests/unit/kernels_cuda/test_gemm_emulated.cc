// The GPU's fixed-order GEMM block body (kernels/cuda/fixed_order_tile.cuh),
// compiled for the host, each block run as 256 threads meeting at a barrier
// where the kernel calls __syncthreads: held to kernels/cpu's GEMM with fp32
// products, bit for bit, in every resident format, over partial tiles of
// rows, columns and k, fp8's 128-wide scale tiles and a k range. It runs
// without a GPU, so the kernel's indexing, staging and decoding are checked
// here; CUDA's compilation of it is checked only on a GPU
// (test_cuda_kernels.cc).
#include <barrier>
#include <cmath>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "kernels/cuda/fixed_order_tile.cuh"
#include "tests/unit/kernels_cuda/cpu_gemm.h"

namespace moed::cuda::gemm_detail {

namespace {
std::barrier<>* emulated_block = nullptr;
}  // namespace

void block_sync() { emulated_block->arrive_and_wait(); }

}  // namespace moed::cuda::gemm_detail

namespace moed::test {
namespace {

namespace tile = cuda::gemm_detail;

// gemm_fixed_order's launch, emulated: every tile of C, one after another,
// each by 256 threads.
void emulated_gemm(const float* a, int m, int lda, const cuda::DeviceMatrix& w, long long k_begin, long long k_end,
                   float* c, int ldc) {
  const long long tiles_x = (w.n + tile::kTileCols - 1) / tile::kTileCols;
  const long long tiles_y = (m + tile::kTileRows - 1) / tile::kTileRows;
  for (long long ty = 0; ty < tiles_y; ++ty) {
    for (long long tx = 0; tx < tiles_x; ++tx) {
      auto shared = std::make_unique<tile::TileShared>();
      std::barrier<> block(tile::kThreads);
      tile::emulated_block = &block;
      std::vector<std::thread> threads;
      for (int tid = 0; tid < tile::kThreads; ++tid)
        threads.emplace_back([&, tid] { tile::gemm_tile(tid, tx, ty, *shared, a, m, lda, w, k_begin, k_end, c, ldc); });
      for (auto& t : threads) t.join();
      tile::emulated_block = nullptr;
    }
  }
}

TEST(GemmFixedOrderEmulated, BlockBodyIsTheCpusBitForBitInEveryFormat) {
  const std::size_t n = 70, k = 160;  // two column tiles, the second partial; fp8: a partial 128-wide scale tile
  std::mt19937 rng(51);
  std::uniform_real_distribution<float> weight(-1.0f, 1.0f), activation(-2.0f, 2.0f);
  // Magnitudes that change by row and by 32-column block, so that every
  // scale (mxfp4's blocks, fp8's tiles, int8's rows) differs from its neighbours.
  std::vector<float> w(n * k);
  for (std::size_t i = 0; i < n; ++i)
    for (std::size_t j = 0; j < k; ++j) w[i * k + j] = std::ldexp(weight(rng), int((j / 32 + i) % 5) - 2);
  for (const kernels::WeightDtype dtype : {kernels::WeightDtype::f32, kernels::WeightDtype::bf16,
                                           kernels::WeightDtype::fp8, kernels::WeightDtype::mxfp4,
                                           kernels::WeightDtype::int8}) {
    SCOPED_TRACE(kernels::to_string(dtype));
    const kernels::EncodedMatrix m = kernels::encode(dtype, w.data(), n, k);
    const cuda::DeviceMatrix view{cuda::DeviceDtype(int(m.dtype)), static_cast<long long>(m.n),
                                  static_cast<long long>(m.k), m.codes.data(),
                                  m.scales.empty() ? nullptr : m.scales.data()};
    for (const auto& [k_begin, k_end] : {std::pair<std::size_t, std::size_t>{0, k}, {32, 144}}) {
      for (const std::size_t rows : {std::size_t(1), std::size_t(19)}) {
        SCOPED_TRACE("k [" + std::to_string(k_begin) + ", " + std::to_string(k_end) + "), " + std::to_string(rows) +
                     " rows");
        std::vector<float> a(rows * (k_end - k_begin));
        for (float& v : a) v = activation(rng);
        std::vector<float> c(rows * n, -7.0f);
        emulated_gemm(a.data(), int(rows), int(k_end - k_begin), view, (long long)k_begin, (long long)k_end, c.data(),
                      int(n));
        const std::vector<float> want = cpu_gemm(m, a, rows, k_begin, k_end);
        ASSERT_EQ(c.size(), want.size());
        EXPECT_EQ(std::memcmp(c.data(), want.data(), c.size() * sizeof(float)), 0)
            << "the block body's chains differ from kernels/cpu's";
      }
    }
  }
}

}  // namespace
}  // namespace moed::test
