// The NCCL backend's probe (comm/nccl/nccl_probe.h): the first missing piece
// named, the verdict on this host (no GPU, CI), and the transport table
// refusing nccl with that reason while auto goes on to the next backend.
// The transport itself: test_nccl_transport.cc.
#include "comm/nccl/nccl_probe.h"

#include <gtest/gtest.h>

#include <string>

#include "comm/nccl/nccl_transport.h"
#include "comm/transport.h"
#include "common/error.h"
#include "tests/unit/comm/run_ranks.h"

namespace moed::comm {
namespace {

NcclFacts everything() {
  NcclFacts f;
  f.gpus = 8;
  f.nccl_version = 22703;
  f.transport_built = true;
  f.experts_on_gpu = true;
  return f;
}

TEST(NcclProbe, NamesTheFirstMissingPiece) {
  EXPECT_EQ(nccl_unavailable_with(everything()), std::nullopt);

  NcclFacts no_gpu = everything();
  no_gpu.no_gpu = "no NVIDIA driver (libcuda.so.1: cannot open shared object file)";
  no_gpu.no_library = "libnccl.so.2: cannot open shared object file";
  const std::optional<std::string> gpu_reason = nccl_unavailable_with(no_gpu);
  ASSERT_TRUE(gpu_reason);
  EXPECT_NE(gpu_reason->find("GPU memory"), std::string::npos) << *gpu_reason;
  EXPECT_NE(gpu_reason->find("no NVIDIA driver (libcuda.so.1"), std::string::npos) << *gpu_reason;

  NcclFacts no_library = everything();
  no_library.no_library = "libnccl.so.2: cannot open shared object file";
  const std::optional<std::string> library_reason = nccl_unavailable_with(no_library);
  ASSERT_TRUE(library_reason);
  EXPECT_NE(library_reason->find("NCCL cannot be loaded: libnccl.so.2"), std::string::npos) << *library_reason;

  NcclFacts not_built = everything();
  not_built.transport_built = false;
  const std::optional<std::string> build_reason = nccl_unavailable_with(not_built);
  ASSERT_TRUE(build_reason);
  EXPECT_NE(build_reason->find("NCCL 2.27.3 and 8 GPUs are here"), std::string::npos) << *build_reason;
  EXPECT_NE(build_reason->find("built without nvcc"), std::string::npos) << *build_reason;

  NcclFacts old = everything();
  old.nccl_version = 21305;
  const std::optional<std::string> old_reason = nccl_unavailable_with(old);
  ASSERT_TRUE(old_reason);
  EXPECT_NE(old_reason->find("NCCL 2.13.5 and 8 GPUs are here, but the transport needs NCCL 2.14.0 or later"),
            std::string::npos) << *old_reason;

  NcclFacts cpu_experts = everything();
  cpu_experts.experts_on_gpu = false;
  const std::optional<std::string> cpu_reason = nccl_unavailable_with(cpu_experts);
  ASSERT_TRUE(cpu_reason);
  EXPECT_NE(cpu_reason->find("the experts run on the CPU ([experts].device)"), std::string::npos) << *cpu_reason;
}

TEST(NcclProbe, VersionCodes) {
  EXPECT_EQ(nccl_version_string(22703), "2.27.3");
  EXPECT_EQ(nccl_version_string(21903), "2.19.3");
}

// Experts on the CPU (the default device): the probe refuses nccl on every
// host, naming why, and never throws.
TEST(NcclProbe, RefusesHereWithAReason) {
  NcclFacts facts;
  ASSERT_NO_THROW(facts = probe_nccl(CommConfig{}));
  EXPECT_EQ(facts.transport_built, nccl_transport_built());
  EXPECT_FALSE(facts.experts_on_gpu);
  EXPECT_EQ(facts.gpus > 0, facts.no_gpu.empty()) << facts.no_gpu;
  const std::optional<std::string> reason = nccl_unavailable_with(facts);
  ASSERT_TRUE(reason);
  EXPECT_FALSE(reason->empty());
}

TEST(NcclProbe, TheTableRefusesNcclNamingTheReasonAndAutoGoesOn) {
  test::run_ranks(2, [](Bootstrap& bootstrap) {
    CommConfig config;
    config.timeout_ms = 10000;
    config.backend = Backend::nccl;
    try {
      create_transport(config, bootstrap);
      ADD_FAILURE() << "the nccl backend started";
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::Usage);  // exit 2
      const std::string what = e.what();
      EXPECT_NE(what.find("[comm].backend = \"nccl\" cannot run here: "), std::string::npos) << what;
      EXPECT_NE(what.find(*nccl_unavailable_with(probe_nccl(config))), std::string::npos) << what;
    }
    config.backend = Backend::automatic;
    EXPECT_STRNE(create_transport(config, bootstrap)->name(), "nccl");
  });
}

}  // namespace
}  // namespace moed::comm
