// The tensor-core GEMM's block body (kernels/cuda/tensor_core_tile.cuh),
// compiled for the host with each warp's 16 x 16 x 16 products emulated (an
// fma chain in k order) and each block run as 128 threads meeting at a
// barrier where the kernel calls __syncthreads. With that stand-in for the
// tensor cores, the body must give exactly the definition's chain (written
// below: bf16 rows, the staged bf16 weights, fp8's scale blocks, int8's row
// scales), over partial tiles of rows, columns and k, ranges off the 32-step
// staging, and in every format; and it must agree with kernels/cpu's bf16
// products, which define the same sums in another order, within fp32
// rounding. The grouped launch's tiles give each expert's rows the bits it
// gives alone. This checks the staging, decoding, blocks, epilogue and
// grouping here; only a GPU checks the tensor cores (test_cuda_kernels.cc).
#include <barrier>
#include <cmath>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include <gtest/gtest.h>

#include "kernels/cpu/bf16_dot_gemm.h"
#include "kernels/cpu/encoded_matrix.h"
#include "kernels/cpu/quant_weights.h"
#include "kernels/cuda/tensor_core_tile.cuh"

namespace moed::cuda::tensor_detail {

namespace {
std::barrier<>* emulated_block = nullptr;
}  // namespace

void block_sync() { emulated_block->arrive_and_wait(); }

}  // namespace moed::cuda::tensor_detail

namespace moed::test {
namespace {

namespace tile = cuda::tensor_detail;
using kernels::WeightDtype;

// One block, emulated: body(tid, shared) on 128 threads meeting at a barrier.
template <class Body>
void run_block(Body&& body) {
  auto shared = std::make_unique<tile::TileShared>();
  std::barrier<> block(tile::kThreads);
  tile::emulated_block = &block;
  std::vector<std::thread> threads;
  for (int tid = 0; tid < tile::kThreads; ++tid) threads.emplace_back([&, tid] { body(tid, *shared); });
  for (auto& t : threads) t.join();
  tile::emulated_block = nullptr;
}

// gemm_tensor_core's launch, emulated: every tile of C in turn.
void emulated_gemm(const float* a, int m, int lda, const cuda::DeviceMatrix& w, long long k_begin, long long k_end,
                   float* c, int ldc) {
  for (long long ty = 0; ty < (m + tile::kRows - 1) / tile::kRows; ++ty)
    for (long long tx = 0; tx < (w.n + tile::kCols - 1) / tile::kCols; ++tx)
      run_block([&](int tid, tile::TileShared& shared) {
        tile::tensor_tile(tid, tx, ty, shared, a, m, lda, w, k_begin, k_end, c, ldc);
      });
}

float bf16_value(unsigned short bits) {
  const std::uint32_t wide = std::uint32_t(bits) << 16;
  float f;
  std::memcpy(&f, &wide, sizeof f);
  return f;
}

// The definition with the emulated products' order: per row and column, the
// fma chain over the staged steps (from k_begin down to a multiple of 32,
// zeros outside the range), fp8 from +0 per 128-step block then scaled into
// C, int8 scaled at the end.
std::vector<float> definition(const std::vector<float>& a, int m, const cuda::DeviceMatrix& w, long long k_begin,
                              long long k_end) {
  std::vector<float> c(std::size_t(m) * std::size_t(w.n));
  const auto* scales = reinterpret_cast<const float*>(w.scales);
  for (int r = 0; r < m; ++r)
    for (long long j = 0; j < w.n; ++j) {
      float acc = 0.0f, block = 0.0f;
      for (long long k = k_begin / 32 * 32; k < (k_end + 31) / 32 * 32; ++k) {
        const bool in = k >= k_begin && k < k_end;
        const float x = in ? bf16_value(tile::bf16_rn(a[std::size_t(r) * std::size_t(k_end - k_begin) +
                                                        std::size_t(k - k_begin)]))
                           : 0.0f;
        const float v = in ? bf16_value(tile::staged_weight(w, j, k)) : 0.0f;
        if (w.dtype != cuda::DeviceDtype::fp8) {
          acc = std::fma(x, v, acc);
          continue;
        }
        block = std::fma(x, v, block);
        if ((k + 1) % 128 == 0 || k + 1 >= (k_end + 31) / 32 * 32) {
          acc = std::fma(block, scales[(j / 128) * ((w.k + 127) / 128) + k / 128], acc);
          block = 0.0f;
        }
      }
      const std::size_t at = std::size_t(r) * std::size_t(w.n) + std::size_t(j);
      c[at] = w.dtype == cuda::DeviceDtype::int8 ? acc * scales[j] : acc;
    }
  return c;
}

cuda::DeviceMatrix view_of(const kernels::EncodedMatrix& m) {
  return {cuda::DeviceDtype(int(m.dtype)), static_cast<long long>(m.n), static_cast<long long>(m.k), m.codes.data(),
          m.scales.empty() ? nullptr : m.scales.data()};
}

struct Weights {
  std::size_t n = 70, k = 320;  // a partial second column tile; fp8: a partial 128-wide scale tile
  std::vector<float> values;
  Weights() : values(n * k) {
    std::mt19937 rng(71);
    std::uniform_real_distribution<float> weight(-1.0f, 1.0f);
    // Magnitudes that change by row and 32-column block: every scale differs from its neighbours.
    for (std::size_t i = 0; i < n; ++i)
      for (std::size_t j = 0; j < k; ++j) values[i * k + j] = std::ldexp(weight(rng), int((j / 32 + i) % 5) - 2);
  }
};

std::vector<float> rows_of(std::size_t rows, std::size_t k, unsigned seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> activation(-2.0f, 2.0f);
  std::vector<float> a(rows * k);
  for (float& v : a) v = activation(rng);
  return a;
}

TEST(TensorCoreEmulated, StagedWeightsAreEachFormatsValuesInBf16) {
  const Weights w;
  for (const WeightDtype dtype : {WeightDtype::bf16, WeightDtype::fp8, WeightDtype::mxfp4, WeightDtype::int8}) {
    SCOPED_TRACE(kernels::to_string(dtype));
    const kernels::EncodedMatrix m = kernels::encode(dtype, w.values.data(), w.n, w.k);
    const cuda::DeviceMatrix v = view_of(m);
    const auto* scales = reinterpret_cast<const float*>(m.scales.data());
    for (std::size_t j = 0; j < w.n; ++j)
      for (std::size_t k = 0; k < w.k; ++k) {
        // What the tensor cores multiply, times the scale applied after them.
        const float after = dtype == WeightDtype::fp8    ? scales[(j / 128) * ((w.k + 127) / 128) + k / 128]
                            : dtype == WeightDtype::int8 ? scales[j]
                                                         : 1.0f;
        const float staged = bf16_value(tile::staged_weight(v, (long long)j, (long long)k));
        ASSERT_EQ(staged * after, m.value(j, k)) << "weight (" << j << ", " << k << ")";
      }
  }
}

TEST(TensorCoreEmulated, BlockBodyIsTheDefinitionsChainInEveryFormat) {
  const Weights w;
  for (const WeightDtype dtype :
       {WeightDtype::f32, WeightDtype::bf16, WeightDtype::fp8, WeightDtype::mxfp4, WeightDtype::int8}) {
    SCOPED_TRACE(kernels::to_string(dtype));
    const kernels::EncodedMatrix m = kernels::encode(dtype, w.values.data(), w.n, w.k);
    const cuda::DeviceMatrix v = view_of(m);
    // Ranges on the staging and off it (mxfp4 needs none: its scales are
    // folded in); 70 rows: a second, partial tile of rows.
    for (const auto& [k_begin, k_end, rows] : {std::tuple<long long, long long, int>{0, 320, 70}, {128, 288, 1},
                                               {40, 301, 70}}) {
      SCOPED_TRACE("k [" + std::to_string(k_begin) + ", " + std::to_string(k_end) + "), " + std::to_string(rows) +
                   " rows");
      const auto a = rows_of(std::size_t(rows), std::size_t(k_end - k_begin), unsigned(72 + rows));
      std::vector<float> c(std::size_t(rows) * w.n, -7.0f);
      emulated_gemm(a.data(), rows, int(k_end - k_begin), v, k_begin, k_end, c.data(), int(w.n));
      const std::vector<float> want = definition(a, rows, v, k_begin, k_end);
      EXPECT_EQ(std::memcmp(c.data(), want.data(), c.size() * sizeof(float)), 0)
          << "the block body's sums differ from the definition's";
    }
  }
}

// gemm_tensor_core_grouped's launch, emulated over its tile list: each
// expert's rows (none, a partial tile, one row, a whole tile) with weights
// of its own in a format of its own, bit for bit what the expert gives alone.
TEST(TensorCoreEmulated, GroupedLaunchGivesEachExpertsRowsTheirOwnBits) {
  const Weights w;
  const std::vector<WeightDtype> formats = {WeightDtype::bf16, WeightDtype::fp8, WeightDtype::mxfp4,
                                            WeightDtype::int8};
  const std::vector<int> offsets = {0, 0, 70, 71, 135};  // rows 0, 70, 1 and 64
  std::vector<kernels::EncodedMatrix> encoded;
  std::vector<cuda::DeviceMatrix> views;
  for (std::size_t e = 0; e < formats.size(); ++e) {
    std::vector<float> values = w.values;
    for (float& v : values) v *= float(e + 1);  // each expert's own weights
    encoded.push_back(kernels::encode(formats[e], values.data(), w.n, w.k));
  }
  for (const auto& m : encoded) views.push_back(view_of(m));
  const std::vector<float> a = rows_of(std::size_t(offsets.back()), w.k, 74);
  const long long k_begin = 128, k_end = 288;  // a range, on fp8's scale blocks
  std::vector<float> grouped(std::size_t(offsets.back()) * w.n, -7.0f);
  const float* range = a.data() + k_begin;  // the range's first column, rows still w.k apart
  for (const tile::GroupedTile& t : tile::grouped_tiles(offsets.data(), int(views.size())))
    for (long long tx = 0; tx < (static_cast<long long>(w.n) + tile::kCols - 1) / tile::kCols; ++tx)
      run_block([&](int tid, tile::TileShared& shared) {
        tile::grouped_tile(tid, tx, t, shared, range, int(w.k), views.data(), k_begin, k_end, grouped.data(),
                           int(w.n));
      });
  for (std::size_t e = 0; e < views.size(); ++e) {
    SCOPED_TRACE("expert " + std::to_string(e));
    const int first = offsets[e], rows = offsets[e + 1] - offsets[e];
    if (rows == 0) continue;
    std::vector<float> alone(std::size_t(rows) * w.n, -7.0f);
    emulated_gemm(range + std::size_t(first) * w.k, rows, int(w.k), views[e], k_begin, k_end, alone.data(), int(w.n));
    EXPECT_EQ(std::memcmp(alone.data(), grouped.data() + std::size_t(first) * w.n, alone.size() * sizeof(float)), 0);
  }
}

// The launch over device offsets finds each block's tile from the offsets
// alone: the same list as the host's, then nothing, whatever the groups.
TEST(TensorCoreEmulated, TileAtFindsTheHostsTileList) {
  const std::vector<std::vector<int>> cases = {
      {0, 0, 70, 71, 135}, {5, 5, 5}, {0, 64, 128, 129}, {3, 200, 200, 201, 265, 329}, {0, 1}};
  for (const std::vector<int>& offsets : cases) {
    const int experts = int(offsets.size()) - 1;
    const std::vector<tile::GroupedTile> want = tile::grouped_tiles(offsets.data(), experts);
    const int bound = (offsets.back() - offsets.front() + tile::kRows - 1) / tile::kRows + experts;
    ASSERT_LE(int(want.size()), bound) << "the launch's bound on the tiles";
    for (int t = 0; t < bound; ++t) {
      tile::GroupedTile got{-1, -1, -1, -1};
      const bool found = tile::tile_at(t, offsets.data(), experts, got);
      ASSERT_EQ(found, t < int(want.size())) << "tile " << t;
      if (!found) continue;
      EXPECT_EQ(got.expert, want[std::size_t(t)].expert) << "tile " << t;
      EXPECT_EQ(got.tile_y, want[std::size_t(t)].tile_y) << "tile " << t;
      EXPECT_EQ(got.first_row, want[std::size_t(t)].first_row) << "tile " << t;
      EXPECT_EQ(got.rows, want[std::size_t(t)].rows) << "tile " << t;
    }
  }
}

// kernels/cpu's bf16 products define the same products, summed in another
// order (pairs of steps): within fp32 rounding of the sums of |products|.
TEST(TensorCoreEmulated, AgreesWithTheCpusBf16ProductsWithinRounding) {
  const Weights w;
  kernels::set_compact_products(kernels::CompactProducts::f32);
  const int rows = 19;
  for (const WeightDtype dtype : {WeightDtype::bf16, WeightDtype::fp8, WeightDtype::mxfp4, WeightDtype::int8}) {
    SCOPED_TRACE(kernels::to_string(dtype));
    const kernels::EncodedMatrix m = kernels::encode(dtype, w.values.data(), w.n, w.k);
    const auto a = rows_of(rows, w.k, 73);
    std::vector<float> gpu(std::size_t(rows) * w.n), cpu(std::size_t(rows) * w.n);
    emulated_gemm(a.data(), rows, int(w.k), view_of(m), 0, (long long)w.k, gpu.data(), int(w.n));
    kernels::gemm_bf16_dot_range(a.data(), rows, kernels::QuantWeights(m), 0, w.k, cpu.data());
    for (int r = 0; r < rows; ++r)
      for (std::size_t j = 0; j < w.n; ++j) {
        double magnitude = 0;  // sum of |products|: what the sums' rounding scales with
        for (std::size_t k = 0; k < w.k; ++k)
          magnitude += std::fabs(double(bf16_value(tile::bf16_rn(a[std::size_t(r) * w.k + k]))) * m.value(j, k));
        const std::size_t at = std::size_t(r) * w.n + j;
        ASSERT_NEAR(gpu[at], cpu[at], 1e-6 * magnitude + 1e-30) << "row " << r << ", column " << j;
      }
  }
}

}  // namespace
}  // namespace moed::test
