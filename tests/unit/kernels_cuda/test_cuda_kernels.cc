// The CUDA kernels against kernels/cpu itself where it has the same step (the
// activations, the combine), else against plain CPU loops written here. Every
// GPU test skips where no usable device is found; the error-path tests run
// everywhere.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <iostream>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "kernels/cpu/bf16_dot_gemm.h"
#include "kernels/cpu/encoded_matrix.h"
#include "kernels/cpu/expert_ffn.h"
#include "kernels/cpu/fixed_order_gemm.h"
#include "kernels/cpu/quant_weights.h"
#include "kernels/cpu/rms_norm.h"
#include "kernels/cpu/fixed_combine.h"
#include "kernels/cuda/cuda_kernels.h"
#include "tests/unit/kernels_cuda/cpu_gemm.h"

namespace {

using moed::cuda::CublasHandle;
using moed::cuda::DeviceBuffer;
using moed::cuda::gpu_available;
using moed::cuda::Stream;

std::vector<float> random_floats(std::size_t n, unsigned seed, float lo, float hi) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (float& f : v) f = dist(rng);
  return v;
}

template <class T>
DeviceBuffer<T> to_device(const std::vector<T>& host) {
  DeviceBuffer<T> d(host.size());
  d.upload(host);
  return d;
}

template <class T>
bool same_bits(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}

// ---- without a GPU ------------------------------------------------------------

TEST(CudaNoGpu, GpuAvailableReturnsAReason) {
  std::string why;
  bool ok = false;
  EXPECT_NO_THROW(ok = gpu_available(&why));
  if (!ok) {
    EXPECT_FALSE(why.empty());
  }
  EXPECT_NO_THROW(gpu_available(nullptr));
}

TEST(CudaNoGpu, CheckMacroThrowsWithLocationAndName) {
  try {
    MOED_CUDA_CHECK(cudaErrorInvalidValue);
    FAIL() << "no exception";
  } catch (const moed::cuda::CudaError& e) {
    EXPECT_EQ(e.line(), __LINE__ - 3);
    EXPECT_NE(std::string(e.what()).find("cudaErrorInvalidValue"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("test_cuda_kernels.cc"), std::string::npos) << e.what();
  }
  try {
    MOED_CUDA_CHECK(CUBLAS_STATUS_INVALID_VALUE);
    FAIL() << "no exception";
  } catch (const moed::cuda::CudaError& e) {
    EXPECT_NE(std::string(e.what()).find("CUBLAS_STATUS_INVALID_VALUE"), std::string::npos) << e.what();
  }
  EXPECT_NO_THROW(MOED_CUDA_CHECK(cudaSuccess));
}

// ---- rms_norm ---------------------------------------------------------------

TEST(CudaKernels, RmsNormMatchesCpu) {
  std::string why;
  if (!gpu_available(&why)) GTEST_SKIP() << why;
  Stream stream;
  for (int hidden : {1000, 4096, 7}) {
    const int rows = 5;
    const float eps = 1e-5f;
    auto x = random_floats(std::size_t(rows) * hidden, 1 + hidden, -3.0f, 3.0f);
    auto w = random_floats(hidden, 2 + hidden, 0.5f, 1.5f);
    std::vector<float> ref(x.size());
    moed::kernels::rms_norm(x.data(), w.data(), std::size_t(rows), std::size_t(hidden), eps, ref.data());
    auto dx = to_device(x), dw = to_device(w);
    DeviceBuffer<float> dout(x.size());
    moed::cuda::rms_norm(dx.data(), dw.data(), rows, hidden, eps, dout.data(), stream);
    moed::cuda::rms_norm(dx.data(), dw.data(), rows, hidden, eps, dx.data(), stream);  // in place
    stream.synchronize();
    const auto out = dout.download();
    EXPECT_TRUE(same_bits(out, ref)) << "not kernels::rms_norm's bits, hidden " << hidden;
    EXPECT_TRUE(same_bits(dx.download(), out)) << "in place differs, hidden " << hidden;
  }
}

// ---- gate_logits --------------------------------------------------------------

TEST(CudaKernels, GateLogitsIsFp32) {
  std::string why;
  if (!gpu_available(&why)) GTEST_SKIP() << why;
  const int tokens = 33, hidden = 512, experts = 64;
  auto x = random_floats(std::size_t(tokens) * hidden, 11, -1.0f, 1.0f);
  auto w = random_floats(std::size_t(experts) * hidden, 12, -0.05f, 0.05f);
  Stream stream;
  CublasHandle handle(stream);
  auto dx = to_device(x), dw = to_device(w);
  DeviceBuffer<float> dl(std::size_t(tokens) * experts), one(experts);
  moed::cuda::gate_logits(handle, dx.data(), dw.data(), tokens, hidden, experts, dl.data());
  const int probe = 17;  // the same row alone, to report batch invariance
  moed::cuda::gate_logits(handle, dx.data() + probe * hidden, dw.data(), 1, hidden, experts, one.data());
  stream.synchronize();
  const auto logits = dl.download();
  for (int t = 0; t < tokens; ++t)
    for (int e = 0; e < experts; ++e) {
      double ref = 0, mag = 0;
      for (int i = 0; i < hidden; ++i) {
        ref += double(x[t * hidden + i]) * double(w[e * hidden + i]);
        mag += std::fabs(double(x[t * hidden + i]) * double(w[e * hidden + i]));
      }
      // fp32 accumulation stays far inside 1e-5 of the magnitude; TF32 (10-bit
      // mantissa inputs) would not.
      ASSERT_LE(std::fabs(logits[t * experts + e] - ref), 1e-5 * mag) << t << "," << e;
    }
  const auto alone = one.download();
  const bool invariant = std::memcmp(alone.data(), logits.data() + probe * experts, experts * sizeof(float)) == 0;
  std::cout << "[ info ] gate_logits row bits " << (invariant ? "equal" : "DIFFER")
            << " between a 1-row and a 33-row call\n";
  RecordProperty("gate_logits_batch_invariant", invariant ? "yes" : "no");
}

// The router: test_cuda_router.cc, against runtime::route.

// ---- grouping and permutation -----------------------------------------------

TEST(CudaKernels, CountAndOffsetsIsAStableGrouping) {
  std::string why;
  if (!gpu_available(&why)) GTEST_SKIP() << why;
  Stream stream;
  struct Case { int pairs, experts, k; };
  for (Case c : {Case{8000, 37, 4}, Case{3001, 1500, 1}, Case{0, 8, 2}, Case{700, 1, 7}}) {
    // Ids in [-1, experts): -1 is "not here" and is dropped; expert 3 never appears.
    std::mt19937 rng(c.pairs + c.experts);
    std::uniform_int_distribution<int> pick(-1, c.experts - 1);
    std::vector<int> ids(c.pairs);
    for (int& e : ids) {
      e = pick(rng);
      if (e == 3) e = 0;
    }
    std::vector<int> counts(c.experts, 0), offsets(c.experts + 1, 0), order;
    for (int e : ids)
      if (e >= 0) ++counts[e];
    for (int e = 0; e < c.experts; ++e) offsets[e + 1] = offsets[e] + counts[e];
    for (int p = 0; p < c.pairs; ++p)
      if (ids[p] >= 0) order.push_back(p);
    std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return ids[a] < ids[b]; });

    DeviceBuffer<int> dids(std::max(c.pairs, 1)), dcounts(c.experts), doffsets(c.experts + 1),
        dorder(std::max(c.pairs, 1)), dtokens(std::max(c.pairs, 1));
    dids.upload(ids);
    moed::cuda::count_and_offsets(dids.data(), c.pairs, c.experts, dcounts.data(), doffsets.data(),
                                  dorder.data(), stream);
    const int kept = int(order.size());
    moed::cuda::pair_tokens(dorder.data(), kept, c.k, dtokens.data(), stream);
    stream.synchronize();
    EXPECT_EQ(dcounts.download(), counts) << c.pairs << " pairs, " << c.experts << " experts";
    EXPECT_EQ(doffsets.download(), offsets);
    auto got = dorder.download();
    got.resize(kept);
    EXPECT_EQ(got, order) << "order must be by expert, then by pair index";
    auto tokens = dtokens.download();
    for (int i = 0; i < kept; ++i) ASSERT_EQ(tokens[i], order[i] / c.k);
  }
}

TEST(CudaKernels, PermuteRowsGathersExactly) {
  std::string why;
  if (!gpu_available(&why)) GTEST_SKIP() << why;
  Stream stream;
  const int src_rows = 50, n = 73;
  std::mt19937 rng(5);
  std::uniform_int_distribution<int> pick(0, src_rows - 1);
  std::vector<int> index(n);
  for (int& i : index) i = pick(rng);  // repeats allowed: a token going to several experts
  auto dindex = to_device(index);
  // 4096: float4 path; 1001: scalar path; 1024 from a misaligned pointer: scalar path.
  for (auto [hidden, shift] : {std::pair{4096, 0}, std::pair{1001, 0}, std::pair{1024, 1}}) {
    auto src = random_floats(std::size_t(src_rows) * hidden + shift, hidden, -1.0f, 1.0f);
    auto dsrc = to_device(src);
    DeviceBuffer<float> ddst(std::size_t(n) * hidden + shift);
    moed::cuda::permute_rows(dsrc.data() + shift, dindex.data(), n, hidden, ddst.data() + shift, stream);
    stream.synchronize();
    const auto dst = ddst.download();
    for (int i = 0; i < n; ++i)
      ASSERT_EQ(0, std::memcmp(dst.data() + shift + std::size_t(i) * hidden,
                               src.data() + shift + std::size_t(index[i]) * hidden, hidden * sizeof(float)))
          << "row " << i << ", hidden " << hidden;
  }
}

// ---- expert FFN ---------------------------------------------------------------

TEST(CudaKernels, ExpertFfnGroupedMatchesDouble) {
  std::string why;
  if (!gpu_available(&why)) GTEST_SKIP() << why;
  const int H = 64, F = 96;
  const std::vector<int> rows_of = {3, 0, 17, 1, 40};
  const int experts = int(rows_of.size());
  std::vector<int> offsets(experts + 1, 0);
  for (int e = 0; e < experts; ++e) offsets[e + 1] = offsets[e] + rows_of[e];
  const int rows = offsets[experts];

  auto x = random_floats(std::size_t(rows) * H, 21, -1.0f, 1.0f);
  std::vector<std::vector<float>> w13(experts), w2(experts);
  std::vector<DeviceBuffer<float>> dw13, dw2;
  std::vector<const float*> p13(experts, nullptr), p2(experts, nullptr);
  for (int e = 0; e < experts; ++e) {
    w13[e] = random_floats(std::size_t(2) * F * H, 100 + e, -0.125f, 0.125f);  // ~1/sqrt(H)
    w2[e] = random_floats(std::size_t(H) * F, 200 + e, -0.1f, 0.1f);           // ~1/sqrt(F)
    if (rows_of[e] == 0) continue;  // an expert without rows needs no weights
    dw13.push_back(to_device(w13[e]));
    dw2.push_back(to_device(w2[e]));
    p13[e] = dw13.back().data();
    p2[e] = dw2.back().data();
  }

  Stream stream;
  CublasHandle handle;
  auto dx = to_device(x);
  DeviceBuffer<float> dscratch(std::size_t(rows) * 2 * F), dy(std::size_t(rows) * H);
  moed::cuda::expert_ffn_grouped(handle, dx.data(), offsets.data(), experts, p13.data(), p2.data(), H, F,
                                 dscratch.data(), dy.data(), stream);
  stream.synchronize();
  const auto y = dy.download();

  std::vector<double> act(F);
  for (int e = 0; e < experts; ++e)
    for (int r = offsets[e]; r < offsets[e + 1]; ++r) {
      const float* xr = x.data() + std::size_t(r) * H;
      for (int f = 0; f < F; ++f) {
        double g = 0, u = 0;
        for (int i = 0; i < H; ++i) {
          g += double(xr[i]) * w13[e][std::size_t(f) * H + i];
          u += double(xr[i]) * w13[e][std::size_t(F + f) * H + i];
        }
        act[f] = g / (1.0 + std::exp(-g)) * u;
      }
      for (int i = 0; i < H; ++i) {
        double ref = 0, mag = 0;
        for (int f = 0; f < F; ++f) {
          ref += act[f] * w2[e][std::size_t(i) * F + f];
          mag += std::fabs(act[f] * w2[e][std::size_t(i) * F + f]);
        }
        // 1e-4 relative to the size of the terms summed (plain |ref| would be
        // ill-conditioned where they cancel).
        ASSERT_LE(std::fabs(y[std::size_t(r) * H + i] - ref), 1e-4 * mag) << "expert " << e << " row " << r << " col " << i;
      }
    }
}

// ---- activations ----------------------------------------------------------------

// Both gated activations give kernels/cpu's bits, with the inputs where the
// element functions branch: exp's clamps, the SwiGLU limits, NaN and inf.
TEST(CudaKernels, GatedActivationIsTheCpusBitForBit) {
  std::string why;
  if (!gpu_available(&why)) GTEST_SKIP() << why;
  const int rows = 7, ffn = 300;
  std::vector<float> h13 = random_floats(std::size_t(rows) * 2 * ffn, 41, -12.0f, 12.0f);
  const float specials[] = {0.0f, -0.0f, 88.8f, -88.8f, -100.0f, 100.0f, 7.0f, -7.0f, 7.5f, -7.5f,
                            std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(),
                            -std::numeric_limits<float>::infinity()};
  for (std::size_t i = 0; i < std::size(specials); ++i) {
    h13[i] = specials[i];                              // row 0's gates
    h13[2 * ffn + ffn + i] = specials[i];              // row 1's ups
  }
  Stream stream;
  for (const bool clamped : {false, true}) {
    SCOPED_TRACE(clamped ? "clamped SwiGLU" : "silu");
    moed::cuda::GatedActivation act;
    act.clamped = clamped;
    std::vector<float> want = h13;
    for (int r = 0; r < rows; ++r) {
      float* row = want.data() + std::size_t(r) * 2 * ffn;
      if (clamped)
        moed::kernels::clamped_swiglu(row, row + ffn, std::size_t(ffn), act.alpha, act.limit, row);
      else
        moed::kernels::silu_mul(row, row + ffn, std::size_t(ffn), row);
    }
    auto d = to_device(h13);
    moed::cuda::gated_activation(d.data(), rows, ffn, act, stream);
    stream.synchronize();
    // NaN's bits are the hardware's (x86 keeps a quiet NaN's payload and
    // makes -inf / inf 0xffc00000; the GPU makes every NaN 0x7fffffff): a
    // NaN must stay a NaN, and every other value must have the CPU's bits.
    std::vector<float> got = d.download();
    ASSERT_EQ(got.size(), want.size());
    for (std::size_t i = 0; i < got.size(); ++i) {
      if (std::isnan(want[i])) {
        EXPECT_TRUE(std::isnan(got[i])) << "element " << i;
      } else {
        EXPECT_EQ(std::bit_cast<std::uint32_t>(got[i]), std::bit_cast<std::uint32_t>(want[i])) << "element " << i;
      }
    }
  }
}

// ---- the fixed-order GEMM over resident formats -----------------------------------

using moed::kernels::WeightDtype;

// An encoded matrix uploaded as the GPU reads it.
struct DeviceEncoded {
  DeviceBuffer<unsigned char> codes, scales;
  moed::cuda::DeviceMatrix view;
};

DeviceEncoded upload(const moed::kernels::EncodedMatrix& m) {
  DeviceEncoded d{to_device(m.codes), to_device(m.scales.empty() ? std::vector<std::uint8_t>{0} : m.scales), {}};
  d.view = {moed::cuda::DeviceDtype(int(m.dtype)), (long long)m.n, (long long)m.k, d.codes.data(),
            m.scales.empty() ? nullptr : d.scales.data()};
  return d;
}

// Every format, partial tiles of rows, columns and k, a k range, 1 to 37
// rows: the GPU's chains give kernels/cpu's bits (so a row's bits do not
// depend on its batch on the GPU either).
TEST(CudaKernels, GemmFixedOrderIsTheCpusBitForBitInEveryFormat) {
  std::string why;
  if (!gpu_available(&why)) GTEST_SKIP() << why;
  const std::size_t n = 150, k = 320;
  auto w = random_floats(n * k, 51, -1.0f, 1.0f);
  // Magnitudes that change by row and by 32-column block: every scale differs from its neighbours.
  for (std::size_t i = 0; i < n; ++i)
    for (std::size_t j = 0; j < k; ++j) w[i * k + j] = std::ldexp(w[i * k + j], int((j / 32 + i) % 5) - 2);
  Stream stream;
  for (const WeightDtype dtype :
       {WeightDtype::f32, WeightDtype::bf16, WeightDtype::fp8, WeightDtype::mxfp4, WeightDtype::int8}) {
    SCOPED_TRACE(moed::kernels::to_string(dtype));
    const moed::kernels::EncodedMatrix m = moed::kernels::encode(dtype, w.data(), n, k);
    const DeviceEncoded d = upload(m);
    for (const auto& [k_begin, k_end] : {std::pair<std::size_t, std::size_t>{0, k}, {64, 256}}) {
      for (const std::size_t rows : {std::size_t(1), std::size_t(17), std::size_t(37)}) {
        SCOPED_TRACE("k [" + std::to_string(k_begin) + ", " + std::to_string(k_end) + "), " +
                     std::to_string(rows) + " rows");
        const auto a = random_floats(rows * (k_end - k_begin), unsigned(52 + rows), -2.0f, 2.0f);
        auto da = to_device(a);
        DeviceBuffer<float> dc(rows * n);
        moed::cuda::gemm_fixed_order(da.data(), int(rows), int(k_end - k_begin), d.view, (long long)k_begin,
                                     (long long)k_end, dc.data(), int(n), stream);
        stream.synchronize();
        EXPECT_TRUE(same_bits(dc.download(), moed::test::cpu_gemm(m, a, rows, k_begin, k_end)))
            << "the GPU's chains differ from kernels/cpu's";
      }
    }
  }
}

// The tensor cores' bf16 products against kernels/cpu's (the same products,
// summed in another order): within 2^-16 of the sum of |products| per
// element, the tolerance docs/gpu.md states. Ranges on fp8's scale blocks.
TEST(CudaKernels, TensorCoreGemmAgreesWithTheCpusBf16Products) {
  std::string why;
  if (!gpu_available(&why)) GTEST_SKIP() << why;
  moed::kernels::set_compact_products(moed::kernels::CompactProducts::f32);
  const std::size_t n = 150, k = 320, rows = 37;
  const auto w = random_floats(n * k, 81, -1.0f, 1.0f);
  const auto a = random_floats(rows * k, 82, -2.0f, 2.0f);
  auto da = to_device(a);
  Stream stream;
  for (const WeightDtype dtype : {WeightDtype::bf16, WeightDtype::fp8, WeightDtype::mxfp4, WeightDtype::int8}) {
    SCOPED_TRACE(moed::kernels::to_string(dtype));
    const moed::kernels::EncodedMatrix m = moed::kernels::encode(dtype, w.data(), n, k);
    const DeviceEncoded d = upload(m);
    DeviceBuffer<float> dc(rows * n);
    moed::cuda::gemm_tensor_core(da.data(), int(rows), int(k), d.view, 0, (long long)k, dc.data(), int(n), stream);
    stream.synchronize();
    const std::vector<float> gpu = dc.download();
    std::vector<float> cpu(rows * n);
    moed::kernels::gemm_bf16_dot_range(a.data(), rows, moed::kernels::QuantWeights(m), 0, k, cpu.data());
    const std::vector<float> rows16 = moed::kernels::encode(WeightDtype::bf16, a.data(), rows, k).values();
    for (std::size_t r = 0; r < rows; ++r)
      for (std::size_t j = 0; j < n; ++j) {
        double magnitude = 0;
        for (std::size_t kk = 0; kk < k; ++kk) magnitude += std::fabs(double(rows16[r * k + kk]) * m.value(j, kk));
        ASSERT_NEAR(gpu[r * n + j], cpu[r * n + j], std::ldexp(magnitude, -16) + 1e-30)
            << "row " << r << ", column " << j;
      }
  }
}

// A row's bits on the tensor cores depend on the row, W and the k range
// alone: alone, and at every position of batches of other sizes.
TEST(CudaKernels, TensorCoreGemmRowBitsDoNotDependOnTheBatch) {
  std::string why;
  if (!gpu_available(&why)) GTEST_SKIP() << why;
  const std::size_t n = 150, k = 320;
  const auto w = random_floats(n * k, 83, -1.0f, 1.0f);
  Stream stream;
  for (const WeightDtype dtype : {WeightDtype::bf16, WeightDtype::fp8, WeightDtype::mxfp4, WeightDtype::int8}) {
    SCOPED_TRACE(moed::kernels::to_string(dtype));
    const moed::kernels::EncodedMatrix m = moed::kernels::encode(dtype, w.data(), n, k);
    const DeviceEncoded d = upload(m);
    const auto row = random_floats(k, 84, -2.0f, 2.0f);
    auto drow = to_device(row);
    DeviceBuffer<float> alone(n);
    moed::cuda::gemm_tensor_core(drow.data(), 1, int(k), d.view, 0, (long long)k, alone.data(), int(n), stream);
    stream.synchronize();
    const std::vector<float> want = alone.download();
    for (const std::size_t batch : {std::size_t(2), std::size_t(63), std::size_t(130)}) {
      auto rows = random_floats(batch * k, unsigned(85 + batch), -2.0f, 2.0f);
      for (const std::size_t at : {std::size_t(0), batch / 2, batch - 1}) {
        std::copy(row.begin(), row.end(), rows.begin() + std::ptrdiff_t(at * k));
        auto drows = to_device(rows);
        DeviceBuffer<float> dc(batch * n);
        moed::cuda::gemm_tensor_core(drows.data(), int(batch), int(k), d.view, 0, (long long)k, dc.data(), int(n),
                                     stream);
        stream.synchronize();
        const std::vector<float> got = dc.download();
        EXPECT_EQ(std::memcmp(got.data() + at * n, want.data(), n * sizeof(float)), 0)
            << "the row at " << at << " of " << batch;
      }
    }
  }
}

// The grouped launches against each expert alone, bit for bit: the GEMM
// over experts of every compact format (none, a partial tile, one row, a
// whole tile of rows), and the whole FFN with bf16 products, with gpt-oss's
// biases and clamped SwiGLU and without.
TEST(CudaKernels, TensorCoreGroupedGivesEachExpertsRowsTheirOwnBits) {
  std::string why;
  if (!gpu_available(&why)) GTEST_SKIP() << why;
  const std::size_t n = 150, k = 320;
  const std::vector<WeightDtype> formats = {WeightDtype::bf16, WeightDtype::fp8, WeightDtype::mxfp4, WeightDtype::int8};
  const std::vector<int> offsets = {0, 0, 70, 71, 135};
  std::vector<DeviceEncoded> on_device;
  std::vector<moed::cuda::DeviceMatrix> views;
  for (std::size_t e = 0; e < formats.size(); ++e) {
    const auto w = random_floats(n * k, unsigned(91 + e), -1.0f, 1.0f);
    on_device.push_back(upload(moed::kernels::encode(formats[e], w.data(), n, k)));
  }
  for (const auto& d : on_device) views.push_back(d.view);
  const auto a = random_floats(std::size_t(offsets.back()) * k, 95, -2.0f, 2.0f);
  auto da = to_device(a);
  DeviceBuffer<float> grouped(std::size_t(offsets.back()) * n), alone(std::size_t(offsets.back()) * n);
  Stream stream;
  moed::cuda::GroupedScratch scratch;
  moed::cuda::gemm_tensor_core_grouped(da.data(), int(k), offsets.data(), int(views.size()), views.data(), 0,
                                       (long long)k, grouped.data(), int(n), scratch, stream);
  for (std::size_t e = 0; e < views.size(); ++e) {
    const int rows = offsets[e + 1] - offsets[e];
    if (rows)
      moed::cuda::gemm_tensor_core(da.data() + std::size_t(offsets[e]) * k, rows, int(k), views[e], 0, (long long)k,
                                   alone.data() + std::size_t(offsets[e]) * n, int(n), stream);
  }
  stream.synchronize();
  EXPECT_TRUE(same_bits(grouped.download(), alone.download())) << "the grouped GEMM";

  const int H = 96, F = 128;
  for (const bool gpt_oss : {false, true}) {
    SCOPED_TRACE(gpt_oss ? "biases and clamped SwiGLU" : "SwiGLU");
    std::vector<DeviceEncoded> matrices;
    std::vector<DeviceBuffer<float>> biases;
    std::vector<moed::cuda::DeviceExpert> experts;
    for (std::size_t e = 0; e < formats.size(); ++e) {
      const auto w13 = random_floats(std::size_t(2 * F * H), unsigned(101 + e), -0.2f, 0.2f);
      const auto w2 = random_floats(std::size_t(H * F), unsigned(111 + e), -0.2f, 0.2f);
      matrices.push_back(upload(moed::kernels::encode(formats[e], w13.data(), 2 * F, H)));
      matrices.push_back(upload(moed::kernels::encode(formats[e], w2.data(), H, F)));
      biases.push_back(to_device(random_floats(std::size_t(2 * F), unsigned(121 + e), -0.5f, 0.5f)));
      biases.push_back(to_device(random_floats(std::size_t(H), unsigned(131 + e), -0.5f, 0.5f)));
    }
    for (std::size_t e = 0; e < formats.size(); ++e) {
      moed::cuda::DeviceExpert x;
      x.w13 = matrices[2 * e].view;
      x.w2 = matrices[2 * e + 1].view;
      x.hidden = H;
      x.ffn = F;
      x.activation.clamped = gpt_oss;
      x.products = moed::cuda::DeviceProducts::bf16;
      if (gpt_oss) {
        x.b13 = biases[2 * e].data();
        x.b2 = biases[2 * e + 1].data();
      }
      experts.push_back(x);
    }
    const auto x = random_floats(std::size_t(offsets.back()) * H, 141, -3.0f, 3.0f);
    auto dx = to_device(x);
    const std::size_t rows = std::size_t(offsets.back());
    DeviceBuffer<float> h13(rows * 2 * F), y(rows * H), h13_alone(rows * 2 * F), y_alone(rows * H);
    moed::cuda::expert_ffn_grouped_tensor(dx.data(), offsets.data(), int(experts.size()), experts.data(),
                                          h13.data(), y.data(), scratch, stream);
    for (std::size_t e = 0; e < experts.size(); ++e) {
      const int m = offsets[e + 1] - offsets[e];
      if (!m) continue;
      const std::size_t r0 = std::size_t(offsets[e]);
      moed::cuda::expert_ffn_up_fixed(experts[e], dx.data() + r0 * H, m, h13_alone.data() + r0 * 2 * F, stream);
      moed::cuda::expert_ffn_down_chunk_fixed(experts[e], h13_alone.data() + r0 * 2 * F, m, 0,
                                              y_alone.data() + r0 * H, stream);
    }
    // The same from offsets in device memory (rows from 0: the first entry).
    std::vector<moed::cuda::DeviceMatrix> w13s, w2s;
    std::vector<const float*> b13s, b2s;
    for (const auto& e : experts) {
      w13s.push_back(e.w13);
      w2s.push_back(e.w2);
      b13s.push_back(e.b13);
      b2s.push_back(e.b2);
    }
    auto d_w13s = to_device(w13s), d_w2s = to_device(w2s);
    auto d_b13s = to_device(b13s), d_b2s = to_device(b2s);
    auto d_offsets = to_device(offsets);
    DeviceBuffer<int> range(2);
    moed::cuda::DeviceGroupedExperts grouped;
    grouped.count = int(experts.size());
    grouped.hidden = H;
    grouped.ffn = F;
    grouped.w13 = d_w13s.data();
    grouped.w2 = d_w2s.data();
    grouped.b13 = gpt_oss ? d_b13s.data() : nullptr;
    grouped.b2 = gpt_oss ? d_b2s.data() : nullptr;
    grouped.activation.clamped = gpt_oss;
    grouped.row_range_scratch = range.data();
    DeviceBuffer<float> y_device(rows * H);
    moed::cuda::expert_ffn_grouped_tensor_device(dx.data(), d_offsets.data(), int(rows), grouped, h13.data(),
                                                 y_device.data(), stream);
    stream.synchronize();
    const std::vector<float> want = y_alone.download();
    EXPECT_TRUE(same_bits(y.download(), want)) << "the grouped FFN";
    EXPECT_TRUE(same_bits(y_device.download(), want)) << "the grouped FFN over device offsets";
  }
}

// The expert FFN chunk by chunk, with gpt-oss's biases and clamped SwiGLU
// and without: kernels/cpu's expert_ffn_up and expert_ffn_down_chunk, bit for bit.
TEST(CudaKernels, ExpertFfnFixedIsTheCpusBitForBit) {
  std::string why;
  if (!gpu_available(&why)) GTEST_SKIP() << why;
  moed::kernels::set_compact_products(moed::kernels::CompactProducts::f32);
  const std::size_t H = 96, F = 128, chunks = 2, rows = 9;
  Stream stream;
  for (const WeightDtype dtype : {WeightDtype::bf16, WeightDtype::fp8, WeightDtype::mxfp4, WeightDtype::int8}) {
    for (const bool gpt_oss : {false, true}) {
      SCOPED_TRACE(std::string(moed::kernels::to_string(dtype)) + (gpt_oss ? ", biases and clamped SwiGLU" : ""));
      const auto w13 = random_floats(2 * F * H, 61, -0.2f, 0.2f), w2 = random_floats(H * F, 62, -0.2f, 0.2f);
      const auto b13 = random_floats(2 * F, 63, -0.5f, 0.5f), b2 = random_floats(H, 64, -0.5f, 0.5f);
      const auto e13 = moed::kernels::encode(dtype, w13.data(), 2 * F, H);
      const auto e2 = moed::kernels::encode(dtype, w2.data(), H, F);
      const moed::kernels::QuantWeights q13(e13), q2(e2);
      moed::kernels::ExpertView cpu;
      cpu.w13_quant = &q13;
      cpu.w2_quant = &q2;
      cpu.hidden = H;
      cpu.ffn = F;
      cpu.chunks = chunks;
      cpu.activation.clamped = gpt_oss;
      if (gpt_oss) {
        cpu.b13 = b13.data();
        cpu.b2 = b2.data();
      }
      const DeviceEncoded d13 = upload(e13), d2 = upload(e2);
      auto db13 = to_device(b13), db2 = to_device(b2);
      moed::cuda::DeviceExpert gpu;
      gpu.w13 = d13.view;
      gpu.w2 = d2.view;
      gpu.hidden = int(H);
      gpu.ffn = int(F);
      gpu.chunks = int(chunks);
      gpu.activation.clamped = gpt_oss;
      if (gpt_oss) {
        gpu.b13 = db13.data();
        gpu.b2 = db2.data();
      }
      const auto x = random_floats(rows * H, 65, -3.0f, 3.0f);
      std::vector<float> h13(rows * 2 * F), y(rows * H);
      moed::kernels::expert_ffn_up(cpu, x.data(), rows, h13.data());
      auto dx = to_device(x);
      DeviceBuffer<float> dh13(rows * 2 * F), dy(rows * H);
      moed::cuda::expert_ffn_up_fixed(gpu, dx.data(), int(rows), dh13.data(), stream);
      stream.synchronize();
      EXPECT_TRUE(same_bits(dh13.download(), h13)) << "up-projection and activation";
      for (std::size_t c = 0; c < chunks; ++c) {
        moed::kernels::expert_ffn_down_chunk(cpu, h13.data(), rows, c, y.data());
        moed::cuda::expert_ffn_down_chunk_fixed(gpu, dh13.data(), int(rows), int(c), dy.data(), stream);
        stream.synchronize();
        EXPECT_TRUE(same_bits(dy.download(), y)) << "down-projection of chunk " << c;
      }
    }
  }
}

// ---- combine ------------------------------------------------------------------

// kernels/cpu/fixed_combine.h's add_weighted_fixed itself, one pair at a time.
std::uint64_t cpu_combine(const std::vector<float>& y, const std::vector<float>& w, const std::vector<int>& token,
                          int hidden, std::vector<long long>& acc) {
  static_assert(sizeof(long long) == sizeof(std::int64_t));
  std::uint64_t saturated = 0;
  for (std::size_t p = 0; p < w.size(); ++p)
    saturated += moed::kernels::add_weighted_fixed(
        reinterpret_cast<std::int64_t*>(acc.data() + std::size_t(token[p]) * hidden), y.data() + p * hidden, w[p],
        std::size_t(hidden));
  return saturated;
}

TEST(CudaKernels, CombineFixedIsBitExactInAnyOrder) {
  std::string why;
  if (!gpu_available(&why)) GTEST_SKIP() << why;
  const int tokens = 40, k = 3, hidden = 300, pairs = tokens * k;
  auto y = random_floats(std::size_t(pairs) * hidden, 31, -8.0f, 8.0f);
  auto w = random_floats(pairs, 32, 0.0f, 1.0f);
  std::vector<int> token(pairs);
  for (int p = 0; p < pairs; ++p) token[p] = p / k;
  y[5] = 1e12f;                                        // saturates high
  y[hidden + 7] = -3e11f;                              // saturates low
  y[2 * hidden + 9] = std::numeric_limits<float>::quiet_NaN();  // poisons token 0's element 9
  y[3 * hidden + 1] = std::numeric_limits<float>::infinity();     // poisons token 1's element 1
  y[4 * hidden + 2] = 1e-30f;                          // rounds to 0
  std::fill_n(w.begin(), 4, 0.5f);  // pairs 0-3 hold the special values above
  w[6] = 0.0f;
  std::mt19937_64 rng(33);
  std::uniform_int_distribution<long long> start(-(1LL << 40), 1LL << 40);
  std::vector<long long> acc0(std::size_t(tokens) * hidden);
  for (long long& a : acc0) a = start(rng);
  auto x = random_floats(acc0.size(), 34, -2.0f, 2.0f);

  std::vector<long long> ref = acc0;
  const std::uint64_t ref_saturated = cpu_combine(y, w, token, hidden, ref);
  ASSERT_GE(ref_saturated, 2u);
  ASSERT_EQ(ref[9], moed::kernels::kFixedNaN);
  ASSERT_EQ(ref[std::size_t(hidden) + 1], moed::kernels::kFixedNaN);

  Stream stream;
  auto run = [&](const std::vector<float>& yy, const std::vector<float>& ww, const std::vector<int>& tt,
                 unsigned long long* saturated) {
    auto dy = to_device(yy), dw = to_device(ww);
    auto dt = to_device(tt);
    auto dacc = to_device(acc0);
    DeviceBuffer<unsigned long long> dsat(1);
    dsat.zero(stream);
    moed::cuda::combine_fixed(dy.data(), dw.data(), dt.data(), pairs, hidden, dacc.data(), dsat.data(), stream);
    stream.synchronize();
    *saturated = dsat.download()[0];
    return dacc.download();
  };
  unsigned long long saturated = 0;
  const auto acc = run(y, w, token, &saturated);
  EXPECT_TRUE(same_bits(acc, ref)) << "GPU fixed-point sum differs from the CPU's";
  EXPECT_EQ(saturated, ref_saturated);

  // The same pairs in a shuffled order: identical bits.
  std::vector<int> perm(pairs);
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), std::mt19937(35));
  std::vector<float> ys(y.size()), ws(pairs);
  std::vector<int> ts(pairs);
  for (int i = 0; i < pairs; ++i) {
    std::copy_n(y.begin() + std::size_t(perm[i]) * hidden, hidden, ys.begin() + std::size_t(i) * hidden);
    ws[i] = w[perm[i]];
    ts[i] = token[perm[i]];
  }
  unsigned long long saturated2 = 0;
  EXPECT_TRUE(same_bits(run(ys, ws, ts, &saturated2), acc)) << "pair order changed the bits";
  EXPECT_EQ(saturated2, saturated);

  // The residual add, bit for bit against the CPU's (NaN where poisoned).
  std::vector<float> ref_out(x.size());
  moed::kernels::residual_from_fixed(x.data(), reinterpret_cast<const std::int64_t*>(ref.data()), x.size(),
                                     ref_out.data());
  auto dx = to_device(x);
  auto dacc = to_device(ref);
  DeviceBuffer<float> dout(x.size());
  moed::cuda::residual_from_fixed(dx.data(), dacc.data(), tokens, hidden, dout.data(), stream);
  stream.synchronize();
  EXPECT_TRUE(same_bits(dout.download(), ref_out)) << "residual_from_fixed differs from the CPU's";
}

}  // namespace
