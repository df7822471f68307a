// The memory a rank would hold, worked out by hand from the config, and the
// refusal naming the keys that dominate when the host cannot hold it.
#include "runtime/config/memory_estimate.h"

#include <gtest/gtest.h>

#include <limits>

#include "tests/unit/test_support.h"

namespace moed::runtime {
namespace {

using test::expect_error;

Config shape(std::int64_t layers, std::int64_t experts, std::int64_t hidden, std::int64_t ffn) {
  Config c = default_config();
  c.model.layers = layers;
  c.model.experts = experts;
  c.model.top_k = 2;
  c.model.hidden = hidden;
  c.model.ffn = ffn;
  c.workload.tokens_per_step = 100;
  return c;
}

std::uint64_t part(const MemoryEstimate& e, const std::string& starts) {
  for (const MemoryPart& p : e.parts)
    if (p.what.rfind(starts, 0) == 0) return p.bytes;
  ADD_FAILURE() << "no part " << starts;
  return 0;
}

TEST(MemoryEstimate, PartsOfARank) {
  const Config c = shape(3, 8, 64, 96);
  // 12 slots on this rank of 2; 100 tokens over 2 ranks = 50 each.
  const MemoryEstimate e = estimate_rank_memory(c, 12, 2);
  EXPECT_EQ(part(e, "expert weights"), 12u * 3 * 64 * 96 * 4);
  EXPECT_EQ(part(e, "packing at load"), 3u * 64 * 96 * 4);  // one more while packing (fixed-order)
  EXPECT_EQ(part(e, "gates"), 2u * 3 * 8 * 64 * 4 + 3 * 64 * 4 + 8 * 64 * 4);
  // Half of each token's 2 pairs leave the rank (the other rank's half).
  EXPECT_EQ(part(e, "step buffers"), 50u * (64 * 20 + 8 * 4) + 50u * 2 / 2 * (2 * 64 * 12));
  EXPECT_EQ(part(e, "expert call scratch"), 100u * (2 * 96 + 2 * 64) * 4);  // 50 tokens x 2 experts rows
  std::uint64_t sum = 0;
  for (const MemoryPart& p : e.parts) sum += p.bytes;
  EXPECT_EQ(e.total(), sum);

  Config blas = c;
  blas.experts.gemm = Gemm::openblas;  // held row-major: no packing copy
  EXPECT_EQ(part(estimate_rank_memory(blas, 12, 2), "expert weights"), 12u * 3 * 64 * 96 * 4);
  for (const MemoryPart& p : estimate_rank_memory(blas, 12, 2).parts) EXPECT_NE(p.what.rfind("packing", 0), 0u);
  EXPECT_EQ(part(estimate_rank_memory(c, 0, 2), "expert weights"), 0u);
}

// A rank's GPU under [experts].device = cuda: the held weights in their
// format (no packing copy), the executors' block buffers, nothing else; a
// GPU too small is refused naming the parts and where the figure came from.
TEST(MemoryEstimate, WhatARanksGpuHolds) {
  Config c = shape(3, 8, 64, 96);
  const std::vector<placement::SlotGroup> slots{{12, 1}};
  const MemoryEstimate e = estimate_device_memory(c, slots, 2, 0);
  EXPECT_EQ(part(e, "expert weights"), 12u * 3 * 64 * 96 * 4);
  EXPECT_EQ(part(e, "GPU executors' block buffers"), 2u * 256 * (2 * 64 + 2 * 96) * 4);
  EXPECT_EQ(part(e, "router on the GPU"), 3u * (8 * 64 + 64 + 2 * 8) * 4);
  const std::uint64_t tokens = (std::uint64_t(c.workload.tokens_per_step) + 1) / 2, k = std::uint64_t(c.model.top_k);
  EXPECT_EQ(part(e, "router's step buffers on the GPU"), tokens * (2 * 64 + 8 + 2 * k + 1) * 4);
  EXPECT_EQ(e.parts.size(), 4u);
  EXPECT_EQ(e.total(), 12u * 3 * 64 * 96 * 4 + 2u * 256 * (2 * 64 + 2 * 96) * 4 + 3u * (8 * 64 + 64 + 2 * 8) * 4 +
                           tokens * (2 * 64 + 8 + 2 * k + 1) * 4);

  c.experts.dtype = "bf16";  // held, and copied to the GPU, in bf16: half the bytes
  EXPECT_EQ(part(estimate_device_memory(c, slots, 2, 0), "expert weights"), 12u * 3 * 64 * 96 * 2);
  // Shards count at their width.
  const MemoryEstimate shards = estimate_device_memory(c, {{4, 1}, {2, 2}}, 2, 0);
  EXPECT_EQ(part(shards, "expert shards"), 2u * 3 * 64 * 48 * 2);

  expect_error([&] { check_memory_fits(e, 1, {e.total() - 1, "free on GPU 0"}, "rank 0's GPU 0"); },
               ErrorKind::Usage, {"rank 0's GPU 0", "free on GPU 0", "expert weights", "[model].hidden"});
  EXPECT_NO_THROW(check_memory_fits(e, 2, {2 * e.total(), "free on GPU 0"}, "rank 0's GPU 0"));
}

TEST(MemoryEstimate, FrontDoorBudgetIsPerRank) {
  Config c = shape(3, 8, 64, 96);
  c.workload.kind = WorkloadKind::ingress;
  c.ingress.max_tokens_per_step = 10;
  const MemoryEstimate e = estimate_rank_memory(c, 12, 4);
  EXPECT_EQ(part(e, "step buffers"), 10u * (64 * 20 + 8 * 4) + 10u * 2 * 3 / 4 * (2 * 64 * 12));
  bool named = false;
  for (const MemoryPart& p : e.parts) named = named || p.keys.find("[ingress].max_tokens_per_step") != std::string::npos;
  EXPECT_TRUE(named);
}

TEST(MemoryEstimate, SaturatesInsteadOfWrapping) {
  const Config c = shape(4096, 65536, 1 << 20, 1 << 22);
  EXPECT_EQ(estimate_rank_memory(c, 4096ull * 65536, 1).total(), std::numeric_limits<std::uint64_t>::max());
  EXPECT_EQ(estimate_generate_memory(c).total(), std::numeric_limits<std::uint64_t>::max());
}

TEST(MemoryEstimate, GenerateHoldsTheWholeModelInItsDtype) {
  Config c = shape(2, 4, 8, 16);
  c.model.dtype = "bf16";
  const MemoryEstimate e = estimate_generate_memory(c);
  EXPECT_EQ(part(e, "expert tensors"), 2u * 4 * 3 * 8 * 16 * 2);
  EXPECT_EQ(part(e, "gates"), 2u * (4 * 8 + 8) * 2 + 4 * 8 * 4);
}

// The example of the issue: the config allows it, no host holds it.
TEST(MemoryEstimate, TooLargeIsAUsageErrorNamingTheKeysAndTheBytes) {
  const Config c = shape(4, 8, 1048576, 4194304);
  const MemoryEstimate e = estimate_rank_memory(c, 16, 2);
  const AvailableMemory host{64ull << 30, "MemAvailable in /proc/meminfo"};
  expect_error([&] { check_memory_fits(e, 1, host, "rank 1"); }, ErrorKind::Usage,
               {"memory: rank 1 needs about " + std::to_string(e.total()) + " bytes",
                "more than the 68719476736 bytes (68.7 GB) available (MemAvailable in /proc/meminfo)",
                "expert weights: 16 slots x 3 x [model].hidden 1048576 x [model].ffn 4194304 x 4 bytes",
                "Lower [model].hidden, [model].ffn, or the slots per rank"});
  // The small parts are left out of the message.
  try {
    check_memory_fits(e, 1, host, "rank 1");
  } catch (const Error& err) {
    EXPECT_EQ(std::string(err.what()).find("gates"), std::string::npos) << err.what();
  }
}

TEST(MemoryEstimate, RanksOnOneHostShareIt) {
  const Config c = shape(3, 8, 64, 96);
  const MemoryEstimate e = estimate_rank_memory(c, 12, 4);
  const AvailableMemory host{e.total() * 3, "test"};
  check_memory_fits(e, 3, host, "rank 0");  // exactly fits
  expect_error([&] { check_memory_fits(e, 4, host, "rank 0"); }, ErrorKind::Usage,
               {"x 4 ranks on this host = " + std::to_string(e.total() * 4) + " bytes"});
}

TEST(MemoryEstimate, DominantPartsEachNameTheirKeys) {
  // Many tokens and a wide hidden size: the step buffers matter as much as the weights.
  Config c = shape(1, 2, 4096, 64);
  c.workload.tokens_per_step = 1 << 16;
  const MemoryEstimate e = estimate_rank_memory(c, 2, 1);
  expect_error([&] { check_memory_fits(e, 1, {1000, "test"}, "rank 0"); }, ErrorKind::Usage,
               {"step buffers: 65536 tokens per rank", "Lower [workload].tokens_per_step, [model].hidden"});
}

}  // namespace
}  // namespace moed::runtime
