// Where experts run (runtime/engine/expert_device.h, expert_executor.h):
// [experts].device chosen from what a process has, each missing piece named,
// and the executor the engine makes for the choice.
#include "runtime/engine/expert_device.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "common/error.h"

namespace moed::runtime {
namespace {

struct Have {
  const char* name;
  GpuFacts facts;
  const char* missing;  // what "cuda" is refused for; nullptr: nothing is missing
};

std::vector<Have> processes() {
  return {
      {"NoCudaBuild", {.why_no_gpu = "this build has no CUDA kernels"}, "this build has no CUDA kernels"},
      {"NoDriver", {.kernels_built = true, .why_no_gpu = "cudaGetDeviceCount: cudaErrorInsufficientDriver"},
       "no usable GPU: cudaGetDeviceCount: cudaErrorInsufficientDriver"},
      {"GpuButNoExecutor", {.kernels_built = true, .gpu_usable = true, .why_no_gpu = ""}, "it has no CUDA expert executor"},
      {"NoGpuNoExecutor", {.kernels_built = true, .why_no_gpu = "cudaGetDeviceCount: no CUDA device"},
       "no usable GPU"},
      {"Everything", {.kernels_built = true, .executor_built = true, .gpu_usable = true, .why_no_gpu = ""}, nullptr},
  };
}

class ChooseExpertDevice : public ::testing::TestWithParam<std::size_t> {};

TEST_P(ChooseExpertDevice, CpuAlwaysCudaOnlyWithEveryPieceAutoTheBestThatRuns) {
  const std::vector<Have> all = processes();
  const Have& have = all[GetParam()];
  const bool can = have.missing == nullptr;

  const DeviceChoice cpu = choose_expert_device("cpu", have.facts);
  EXPECT_EQ(cpu.device, ExpertDevice::cpu);

  const DeviceChoice automatic = choose_expert_device("auto", have.facts);
  EXPECT_EQ(automatic.device, can ? ExpertDevice::cuda : ExpertDevice::cpu);
  if (!can) {
    EXPECT_NE(automatic.why.find(have.missing), std::string::npos) << automatic.why;
  }

  if (can) {
    EXPECT_EQ(choose_expert_device("cuda", have.facts).device, ExpertDevice::cuda);
  } else {
    try {
      choose_expert_device("cuda", have.facts);
      ADD_FAILURE() << "cuda was not refused";
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::Usage);  // exit 2
      const std::string what = e.what();
      EXPECT_NE(what.find("[experts].device = \"cuda\""), std::string::npos) << what;
      EXPECT_NE(what.find(have.missing), std::string::npos) << what;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Processes, ChooseExpertDevice, ::testing::Range<std::size_t>(0, processes().size()),
                         [](const ::testing::TestParamInfo<std::size_t>& info) {
                           return std::string(processes()[info.param].name);
                         });

TEST(ChooseExpertDevice, AnUnknownDeviceIsAUsageErrorNamingIt) {
  try {
    choose_expert_device("tpu", GpuFacts{});
    ADD_FAILURE() << "tpu was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::Usage);
    EXPECT_NE(std::string(e.what()).find("\"tpu\""), std::string::npos) << e.what();
  }
}

// On a GPU, compact experts take fp32 products (auto, f32) or bf16 on the
// tensor cores; the CPU's other products are refused naming the choices.
TEST(GpuProducts, Fp32ByDefaultBf16OnTheTensorCoresNothingElse) {
  EXPECT_EQ(gpu_products("auto"), kernels::CompactProducts::f32);
  EXPECT_EQ(gpu_products("f32"), kernels::CompactProducts::f32);
  EXPECT_EQ(gpu_products("bf16"), kernels::CompactProducts::bf16);
  for (const char* other : {"int8", "amx", "fp8"}) {
    try {
      gpu_products(other);
      ADD_FAILURE() << other << " was accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::Usage);
      EXPECT_NE(std::string(e.what()).find(std::string("\"") + other + "\""), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("auto, f32 or bf16"), std::string::npos) << e.what();
    }
  }
}

// The probe never throws: with no driver or no GPU (this machine, CI) it says why.
TEST(ProbeGpus, SaysWhyThereIsNoGpu) {
  GpuFacts facts;
  ASSERT_NO_THROW(facts = probe_gpus());
  EXPECT_EQ(facts.gpu_usable, facts.why_no_gpu.empty()) << facts.why_no_gpu;
  EXPECT_EQ(facts.executor_built, facts.kernels_built);  // the CUDA executor comes with the kernels
  EXPECT_EQ(facts.gpus > 0, facts.gpu_usable);
  if (!facts.kernels_built) {
    EXPECT_FALSE(facts.gpu_usable);
  }
}

TEST(MakeExpertExecutor, TheCpuExecutorOnCpu) {
  EXPECT_EQ(make_expert_executor(ExpertDevice::cpu)->device(), ExpertDevice::cpu);
}

#if !defined(MOED_HAVE_CUDA_EXECUTOR)
TEST(MakeExpertExecutor, AUsageErrorForADeviceThisBuildLacks) {
  try {
    make_expert_executor(ExpertDevice::cuda);
    ADD_FAILURE() << "a cuda executor was made";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::Usage);
    EXPECT_NE(std::string(e.what()).find("cuda"), std::string::npos) << e.what();
  }
}
#endif

}  // namespace
}  // namespace moed::runtime
