// gpu_of_rank, the one rule for the GPU a rank uses: the CUDA device (local
// rank mod the visible devices) and the physical GPU CUDA_VISIBLE_DEVICES names
// for it; as the start-up log line uses it (CUDA's device count) and as the
// topology uses it (the GPUs the variable leaves visible, found in hwloc's list).
#include "launch/rank_gpu.h"

#include <gtest/gtest.h>

#include <optional>
#include <string>

#include "launch/nvlink_islands.h"
#include "tests/unit/launch/topology_test_support.h"

namespace moed::launch {
namespace {

using test_topology::load;

void expect_gpu(const RankGpu& gpu, int device, const std::string& physical) {
  EXPECT_EQ(gpu.device, device);
  EXPECT_EQ(gpu.physical, physical);
}

TEST(GpuOfRank, LocalRankModuloTheVisibleDevices) {
  expect_gpu(gpu_of_rank(3, 8, std::nullopt), 3, "3");
  expect_gpu(gpu_of_rank(0, 8, std::nullopt), 0, "0");
  expect_gpu(gpu_of_rank(5, 4, std::nullopt), 1, "1");  // more ranks than GPUs: shared
  expect_gpu(gpu_of_rank(3, 1, std::nullopt), 0, "0");  // one device visible
  expect_gpu(gpu_of_rank(3, 0, std::nullopt), -1, "");  // no GPU
  expect_gpu(gpu_of_rank(3, -1, std::nullopt), -1, "");
  expect_gpu(gpu_of_rank(-1, 4, std::nullopt), 0, "0");  // a negative local rank counts as 0
}

TEST(GpuOfRank, CudaVisibleDevicesNamesThePhysicalGpu) {
  // CUDA numbers the visible devices in the order the variable lists them.
  expect_gpu(gpu_of_rank(0, 2, "2,3"), 0, "2");
  expect_gpu(gpu_of_rank(3, 2, "2,3"), 1, "3");
  expect_gpu(gpu_of_rank(5, 1, "5"), 0, "5");  // moed-rank --set-cuda-visible-devices
  expect_gpu(gpu_of_rank(2, 4, "4,5,6,7"), 2, "6");  // Slurm's gres
  expect_gpu(gpu_of_rank(0, 1, "GPU-8e1d7c6a"), 0, "GPU-8e1d7c6a");
  expect_gpu(gpu_of_rank(1, 2, "3"), 1, "");  // the variable lists fewer GPUs than CUDA sees
  expect_gpu(gpu_of_rank(0, 0, ""), -1, "");  // every GPU hidden
}

TEST(VisibleGpuCount, OnePerEntryElseAllOfTheHosts) {
  EXPECT_EQ(visible_gpu_count(4, std::nullopt), 4);
  EXPECT_EQ(visible_gpu_count(4, "2,3"), 2);
  EXPECT_EQ(visible_gpu_count(4, "GPU-a,GPU-b,GPU-c"), 3);
  EXPECT_EQ(visible_gpu_count(0, "7"), 1) << "the variable, not the host, says what is visible";
  EXPECT_EQ(visible_gpu_count(4, ""), 0);
  EXPECT_EQ(visible_gpu_count(0, std::nullopt), 0);
}

// The rank's GPU in hwloc's list, as the islands, the descriptions and the
// NUMA binding find it.
int host_gpu(const HostTopology& host, int local_rank, const std::optional<std::string>& cvd) {
  const int visible = visible_gpu_count(int(host.gpus.size()), cvd);
  return host_gpu_index(host, gpu_of_rank(local_rank, visible, cvd).physical);
}

TEST(GpuOfRank, OnAHostIsFoundInHwlocsList) {
  const HostTopology t = load("2x4-nvlink-pairs-host1.xml");
  EXPECT_EQ(host_gpu(t, 1, std::nullopt), 1);
  EXPECT_EQ(host_gpu(t, 5, std::nullopt), 1);
  EXPECT_EQ(host_gpu(t, 0, "2,3"), 2);
  EXPECT_EQ(host_gpu(t, 3, "2,3"), 3);
  EXPECT_EQ(host_gpu(t, 0, "7"), -1) << "no GPU 7 on this host";
  EXPECT_EQ(host_gpu(t, 0, "GPU-8e1d7c6a"), -1) << "a UUID cannot be matched";
  EXPECT_EQ(host_gpu(t, 0, ""), -1) << "every GPU hidden";
  EXPECT_EQ(host_gpu(HostTopology{}, 0, std::nullopt), -1);
}

TEST(HostGpuIndex, AnIndexInPciOrderOnTheHost) {
  const HostTopology t = load("2x4-nvlink-pairs-host1.xml");
  EXPECT_EQ(host_gpu_index(t, "0"), 0);
  EXPECT_EQ(host_gpu_index(t, "3"), 3);
  for (const char* other : {"4", "-1", "", "1x", " 1", "GPU-8e1d7c6a", "MIG-GPU-8e1d7c6a/1/0"})
    EXPECT_EQ(host_gpu_index(t, other), -1) << other;
}

}  // namespace
}  // namespace moed::launch
