// The experts on a GPU (runtime/engine/cuda_expert_executor.h) against the
// CPU executor, answer for answer, bit for bit, with fp32 products: f32,
// bf16, fp8, mxfp4 and int8, Mixtral's and gpt-oss's experts (biases, clamped SwiGLU), rows
// answered in fp32 and rows weighted onto fixed-point sums, 2 canonical
// chunks; a slot made again (migration) copied again; idle copies let go.
// With bf16 products (the tensor cores), answers independent of the blocks.
// Built where the CUDA kernels are; every test skips without a usable GPU.
#if defined(MOED_HAVE_CUDA_EXECUTOR)
#include "runtime/engine/cuda_expert_executor.h"

#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "common/rng.h"
#include "kernels/cpu/bf16_dot_gemm.h"
#include "kernels/cuda/gpu_probe.h"
#include "placement/placement.h"
#include "runtime/config/config.h"
#include "runtime/engine/cpu_expert_executor.h"
#include "runtime/weights/expert_store.h"

namespace moed::runtime {
namespace {

constexpr int kHidden = 64, kFfn = 256, kRows = 23;

Config config_of(const std::string& family, const std::string& dtype, int chunks) {
  return load_config("", {"model.layers=2", "model.experts=4", "model.top_k=2", "model.hidden=64", "model.ffn=256",
                          "model.family=" + family, "experts.dtype=" + dtype,
                          "experts.ffn_chunks=" + std::to_string(chunks)});
}

// The answers of `rows` rows of `expert` through `executor`: fp32 for the
// even rows when the expert has one chunk, weighted fixed-point sums (from a
// non-zero start) otherwise.
std::vector<std::byte> answers(ExpertExecutor& executor, const kernels::ExpertView& expert, ExpertCallCounts* counts) {
  CounterRng rng(7);
  std::vector<float> x(std::size_t(kRows) * kHidden);
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = rng.normalish(i);
  const std::size_t row_bytes = kHidden * sizeof(std::int64_t);
  std::vector<std::byte> out(std::size_t(kRows) * row_bytes, std::byte{3});
  std::vector<ExpertRow> rows;
  for (int i = 0; i < kRows; ++i) {
    const bool single = expert.chunks == 1 && i % 2 == 0;
    rows.push_back({x.data() + std::size_t(i) * kHidden, out.data() + std::size_t(i) * row_bytes,
                    0.125f + 0.03f * float(i), single});
  }
  *counts = executor.run(expert, rows, {});
  return out;
}

struct Case {
  const char* family;
  const char* dtype;
  int chunks;
};

class CudaExpertExecutorMatchesCpu : public ::testing::TestWithParam<Case> {};

TEST_P(CudaExpertExecutorMatchesCpu, AnswerForAnswerBitForBit) {
  std::string why;
  int gpus = 0;
  if (!cuda::gpu_available(&why, &gpus)) GTEST_SKIP() << why;
  kernels::set_compact_products(kernels::CompactProducts::f32);
  const Case k = GetParam();
  const Config c = config_of(k.family, k.dtype, k.chunks);
  ExpertStore store = ExpertStore::load(c, placement::contiguous(1, 2, 4), 0);
  CpuExpertExecutor cpu(8);  // blocks of 8 rows: three blocks, the last partial
  CudaExpertExecutor gpu(0, 8);
  for (int e = 0; e < 4; ++e) {
    SCOPED_TRACE("expert " + std::to_string(e));
    ExpertCallCounts on_cpu, on_gpu;
    const auto want = answers(cpu, store.expert(1, e), &on_cpu);
    const auto got = answers(gpu, store.expert(1, e), &on_gpu);
    EXPECT_EQ(std::memcmp(want.data(), got.data(), want.size()), 0) << "the GPU's answers differ from the CPU's";
    EXPECT_EQ(on_gpu.saturated, on_cpu.saturated);
    EXPECT_EQ(on_gpu.nonfinite, on_cpu.nonfinite);
  }
  EXPECT_EQ(gpu.experts_on_device(), 4u);

  // A slot made again (what a migration does) is copied again, with the same bits.
  ExpertCallCounts counts;
  const auto before = answers(gpu, store.expert(1, 2), &counts);
  std::vector<std::uint8_t> flat(store.slot_bytes());
  store.copy_slot(1, 2, flat.data());
  store.drop_slot(1, 2);
  store.add_slot(1, 2, flat.data());
  const auto after = answers(gpu, store.expert(1, 2), &counts);
  EXPECT_EQ(gpu.experts_on_device(), 5u);
  EXPECT_EQ(std::memcmp(before.data(), after.data(), before.size()), 0);

  // Copies no step used for kIdleSteps steps are let go; one in use stays.
  for (std::uint64_t s = 0; s <= CudaExpertExecutor::kIdleSteps; ++s) {
    gpu.begin_step();
    if (s % 2 == 0) answers(gpu, store.expert(1, 0), &counts);
  }
  EXPECT_EQ(gpu.experts_on_device(), 1u);
}

// With bf16 products the executor's GEMMs take the tensor cores: answers of
// their own (not fp32 products'), the same bits in blocks of 8 rows as in
// one block of all of them.
TEST(CudaExpertExecutorTensorCores, AnswersDoNotDependOnTheBlocks) {
  std::string why;
  int gpus = 0;
  if (!cuda::gpu_available(&why, &gpus)) GTEST_SKIP() << why;
  for (const char* dtype : {"bf16", "fp8", "mxfp4", "int8"}) {
    SCOPED_TRACE(dtype);
    const Config c = config_of("mixtral", dtype, 2);
    ExpertStore store = ExpertStore::load(c, placement::contiguous(1, 2, 4), 0);
    ExpertCallCounts counts;
    kernels::set_compact_products(kernels::CompactProducts::f32);
    CudaExpertExecutor fp32(0, 256);
    const auto fp32_answers = answers(fp32, store.expert(1, 1), &counts);
    kernels::set_compact_products(kernels::CompactProducts::bf16);
    CudaExpertExecutor small_blocks(0, 8), one_block(0, 256);
    const auto in_blocks = answers(small_blocks, store.expert(1, 1), &counts);
    const auto whole = answers(one_block, store.expert(1, 1), &counts);
    EXPECT_EQ(std::memcmp(in_blocks.data(), whole.data(), whole.size()), 0) << "the answers depend on the blocks";
    EXPECT_NE(std::memcmp(whole.data(), fp32_answers.data(), whole.size()), 0) << "fp32 products' answers";
  }
  kernels::set_compact_products(kernels::CompactProducts::f32);
}

INSTANTIATE_TEST_SUITE_P(Formats, CudaExpertExecutorMatchesCpu,
                         ::testing::Values(Case{"mixtral", "f32", 1}, Case{"mixtral", "bf16", 1},
                                           Case{"mixtral", "fp8", 2}, Case{"mixtral", "mxfp4", 2},
                                           Case{"mixtral", "int8", 1},
                                           Case{"gpt-oss", "mxfp4", 1}, Case{"gpt-oss", "bf16", 2}),
                         [](const ::testing::TestParamInfo<Case>& info) {
                           std::string name = std::string(info.param.family) + "_" + info.param.dtype + "_" +
                                              std::to_string(info.param.chunks) + "chunks";
                           for (char& ch : name)
                             if (ch == '-') ch = '_';
                           return name;
                         });

}  // namespace
}  // namespace moed::runtime
#endif
