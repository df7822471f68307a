// detect_launch: which launcher started the rank, its local rank and local size,
// read from a fake environment. describe_binding and its helpers: where a rank
// runs (cores, NUMA node, GPU), from given facts; probe_binding on a fake sysfs.
#include "launch/launch_env.h"

#include <gtest/gtest.h>
#include <sched.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "tests/unit/test_support.h"

namespace moed::launch {
namespace {

using Env = std::map<std::string, std::string>;

EnvLookup lookup(const Env& env) {
  return [env](const char* name) -> std::optional<std::string> {
    auto it = env.find(name);
    if (it == env.end()) return std::nullopt;
    return it->second;
  };
}

struct LaunchCase {
  const char* name;
  Env env;
  const char* launcher;
  int local_rank, local_size;
};

class DetectLaunch : public ::testing::TestWithParam<LaunchCase> {};

TEST_P(DetectLaunch, ReadsTheLaunchersVariables) {
  const auto& c = GetParam();
  const LaunchInfo info = detect_launch(lookup(c.env));
  EXPECT_EQ(info.launcher, c.launcher);
  EXPECT_EQ(info.local_rank, c.local_rank);
  EXPECT_EQ(info.local_size, c.local_size);
}

INSTANTIATE_TEST_SUITE_P(
    Environments, DetectLaunch,
    ::testing::Values(
        LaunchCase{"OpenMpi",
                   {{"OMPI_COMM_WORLD_LOCAL_RANK", "3"}, {"OMPI_COMM_WORLD_LOCAL_SIZE", "8"},
                    {"OMPI_COMM_WORLD_RANK", "11"}},
                   "mpirun", 3, 8},
        LaunchCase{"OpenMpiRankZero",
                   {{"OMPI_COMM_WORLD_LOCAL_RANK", "0"}, {"OMPI_COMM_WORLD_LOCAL_SIZE", "1"}},
                   "mpirun", 0, 1},
        // mpirun inside a Slurm allocation: mpirun is the launcher.
        LaunchCase{"OpenMpiInsideSlurm",
                   {{"OMPI_COMM_WORLD_LOCAL_RANK", "1"}, {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"},
                    {"SLURM_LOCALID", "0"}, {"SLURM_TASKS_PER_NODE", "16"}},
                   "mpirun", 1, 2},
        LaunchCase{"SlurmOnly", {{"SLURM_LOCALID", "2"}, {"SLURM_TASKS_PER_NODE", "4(x2)"}}, "slurm", 2,
                   4},
        LaunchCase{"SlurmPlainCount", {{"SLURM_LOCALID", "0"}, {"SLURM_TASKS_PER_NODE", "6"}}, "slurm",
                   0, 6},
        LaunchCase{"SlurmWithoutTasksPerNode", {{"SLURM_LOCALID", "0"}}, "slurm", 0, 1},
        LaunchCase{"None", {}, "none", 0, 1},
        LaunchCase{"UnrelatedVariables", {{"PATH", "/usr/bin"}, {"OMPI_MCA_foo", "1"}}, "none", 0, 1},
        // Malformed numbers are ignored in favour of the next source.
        LaunchCase{"MalformedOmpiRankFallsToSlurm",
                   {{"OMPI_COMM_WORLD_LOCAL_RANK", "x"}, {"SLURM_LOCALID", "1"},
                    {"SLURM_TASKS_PER_NODE", "4(x2)"}},
                   "slurm", 1, 4},
        LaunchCase{"NegativeOmpiRankIgnored", {{"OMPI_COMM_WORLD_LOCAL_RANK", "-1"}}, "none", 0, 1},
        LaunchCase{"TrailingJunkIgnored", {{"OMPI_COMM_WORLD_LOCAL_RANK", "2abc"}}, "none", 0, 1},
        LaunchCase{"EmptyIgnored", {{"OMPI_COMM_WORLD_LOCAL_RANK", ""}, {"SLURM_LOCALID", ""}}, "none",
                   0, 1},
        LaunchCase{"OverflowIgnored", {{"SLURM_LOCALID", "99999999999999999999"}}, "none", 0, 1},
        // A malformed size falls back to the smallest consistent with the rank.
        LaunchCase{"MalformedOmpiSize",
                   {{"OMPI_COMM_WORLD_LOCAL_RANK", "3"}, {"OMPI_COMM_WORLD_LOCAL_SIZE", "eight"}},
                   "mpirun", 3, 4},
        LaunchCase{"MalformedSlurmTasksPerNode",
                   {{"SLURM_LOCALID", "2"}, {"SLURM_TASKS_PER_NODE", "many"}}, "slurm", 2, 3},
        // A size below the rank cannot be: at least rank + 1.
        LaunchCase{"SizeBelowRank",
                   {{"OMPI_COMM_WORLD_LOCAL_RANK", "5"}, {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"}},
                   "mpirun", 5, 6}),
    [](const auto& info) { return std::string(info.param.name); });

TEST(DetectLaunchHost, IsThisMachinesHostName) {
  char host[256] = {};
  ASSERT_EQ(::gethostname(host, sizeof host - 1), 0);
  EXPECT_EQ(detect_launch(lookup({})).host, std::string(host));
}

// ---- where a rank runs ----------------------------------------------------

LaunchInfo rank_on_host(int local_rank, int local_size) {
  LaunchInfo info;
  info.launcher = "mpirun";
  info.local_rank = local_rank;
  info.local_size = local_size;
  info.host = "node1";
  return info;
}

std::vector<int> range(int first, int last) {
  std::vector<int> v;
  for (int c = first; c <= last; ++c) v.push_back(c);
  return v;
}

TEST(FormatCpuList, WritesRangesLikeTheKernel) {
  EXPECT_EQ(format_cpu_list({}), "");
  EXPECT_EQ(format_cpu_list({5}), "5");
  EXPECT_EQ(format_cpu_list({0, 1}), "0-1");
  EXPECT_EQ(format_cpu_list({0, 1, 2, 3, 8}), "0-3,8");
  EXPECT_EQ(format_cpu_list({0, 2, 4}), "0,2,4");
  EXPECT_EQ(format_cpu_list({0, 1, 2, 3, 8, 10, 11}), "0-3,8,10-11");
  // Unsorted input with duplicates: the same ranges.
  EXPECT_EQ(format_cpu_list({11, 3, 8, 0, 2, 1, 10, 3}), "0-3,8,10-11");
  EXPECT_EQ(format_cpu_list(range(0, 191)), "0-191");
}

TEST(ParseCpuList, ReadsSysfsCpulists) {
  EXPECT_EQ(parse_cpu_list("0-3,8\n"), (std::vector<int>{0, 1, 2, 3, 8}));
  EXPECT_EQ(parse_cpu_list("7"), (std::vector<int>{7}));
  EXPECT_EQ(parse_cpu_list("0,8"), (std::vector<int>{0, 8}));
  EXPECT_EQ(parse_cpu_list("\n"), std::vector<int>{});  // a memory-only NUMA node
  EXPECT_EQ(parse_cpu_list("10-11,0-1"), (std::vector<int>{0, 1, 10, 11}));
  for (const char* bad : {"a", "1-", "-1", "3-1", "0,,1", "0-3x", "1 2"})
    EXPECT_EQ(parse_cpu_list(bad), std::nullopt) << bad;
}

TEST(ParseCpuList, RoundTripsWithFormat) {
  for (const std::vector<int>& cpus :
       {std::vector<int>{0}, range(0, 63), std::vector<int>{0, 1, 2, 3, 8, 10, 11, 100}}) {
    EXPECT_EQ(parse_cpu_list(format_cpu_list(cpus)), cpus);
  }
}

TEST(NumaNodesOf, TheNodesTheCoresTouch) {
  const std::vector<std::vector<int>> two_sockets{range(0, 7), range(8, 15)};
  EXPECT_EQ(numa_nodes_of(range(0, 7), two_sockets), std::vector<int>{0});
  EXPECT_EQ(numa_nodes_of({9, 10}, two_sockets), std::vector<int>{1});
  EXPECT_EQ(numa_nodes_of({7, 8}, two_sockets), (std::vector<int>{0, 1}));
  EXPECT_EQ(numa_nodes_of({99}, two_sockets), std::vector<int>{});
  EXPECT_EQ(numa_nodes_of({0}, {}), std::vector<int>{});
  // A memory-only node (no CPUs) never matches.
  EXPECT_EQ(numa_nodes_of(range(0, 15), {range(0, 15), {}}), std::vector<int>{0});
}

struct BindingCase {
  const char* name;
  int local_rank, local_size;
  BindingFacts facts;
  const char* expected;
};

class DescribeBinding : public ::testing::TestWithParam<BindingCase> {};

TEST_P(DescribeBinding, OnePhraseForTheLogLine) {
  const auto& c = GetParam();
  EXPECT_EQ(describe_binding(rank_on_host(c.local_rank, c.local_size), c.facts), c.expected);
}

const std::vector<std::vector<int>> kTwoNodes{range(0, 15), range(16, 31)};

INSTANTIATE_TEST_SUITE_P(
    Facts, DescribeBinding,
    ::testing::Values(
        // This machine's kind: 2 cores, one NUMA node, no GPU.
        BindingCase{"CpuOnly", 1, 4, {{0, 1}, 0, std::nullopt, {{0, 1}}}, "cores 0-1 (NUMA node 0), no GPU"},
        // 8 GPUs, rank bound to its GPU's NUMA node by moed-rank.
        BindingCase{"BoundToGpusNode", 5, 8, {range(16, 31), 8, std::nullopt, kTwoNodes},
                    "cores 16-31 (NUMA node 1), GPU 5 of 8"},
        BindingCase{"Unbound", 0, 8, {range(0, 31), 8, std::nullopt, kTwoNodes},
                    "cores 0-31 (NUMA nodes 0-1), GPU 0 of 8"},
        BindingCase{"OneCore", 0, 1, {{3}, 1, std::nullopt, kTwoNodes}, "core 3 (NUMA node 0), GPU 0 of 1"},
        BindingCase{"ScatteredCores", 2, 4, {{0, 1, 2, 3, 8}, 4, std::nullopt, {}},
                    "cores 0-3,8, GPU 2 of 4"},
        // moed-rank --set-cuda-visible-devices: one device, the physical one named.
        BindingCase{"OneVisibleDevice", 5, 8, {range(16, 31), 1, "5", kTwoNodes},
                    "cores 16-31 (NUMA node 1), GPU 0 of 1 = physical GPU 5 (CUDA_VISIBLE_DEVICES=5)"},
        // Slurm's gres: every task sees the node's GPUs, listed; CUDA numbers them in list order.
        BindingCase{"SlurmGresList", 2, 4, {range(0, 15), 4, "4,5,6,7", kTwoNodes},
                    "cores 0-15 (NUMA node 0), GPU 2 of 4 = physical GPU 6 (CUDA_VISIBLE_DEVICES=4,5,6,7)"},
        BindingCase{"Uuids", 0, 1, {{0}, 1, "GPU-8f3c", {}},
                    "core 0, GPU 0 of 1 = physical GPU GPU-8f3c (CUDA_VISIBLE_DEVICES=GPU-8f3c)"},
        BindingCase{"VariableShorterThanCount", 1, 2, {{0}, 2, "3", {}},
                    "core 0, GPU 1 of 2 (CUDA_VISIBLE_DEVICES=3)"},
        BindingCase{"NoGpuButVariableSet", 0, 1, {{0, 1}, 0, "", {}}, "cores 0-1, no GPU (CUDA_VISIBLE_DEVICES=\"\")"},
        // More ranks than GPUs: they share, round robin.
        BindingCase{"MoreRanksThanGpus", 5, 8, {range(0, 31), 4, std::nullopt, {}}, "cores 0-31, GPU 1 of 4"},
        BindingCase{"NothingKnown", 0, 1, {{}, 0, std::nullopt, kTwoNodes}, "cores unknown, no GPU"},
        // Cores outside every listed node (a stale topology): no node named.
        BindingCase{"CoresOutsideNodes", 0, 1, {{64}, 0, std::nullopt, kTwoNodes}, "core 64, no GPU"}),
    [](const auto& info) { return std::string(info.param.name); });

// A fake sysfs tree with the NUMA files probe_binding reads.
void write_file(const std::filesystem::path& path, const std::string& text) {
  std::filesystem::create_directories(path.parent_path());
  std::ofstream(path) << text;
}

TEST(ProbeBinding, ReadsNumaNodesAndTheEnvironment) {
  test::TempDir sys;
  write_file(sys.path() / "devices/system/node/online", "0-1\n");
  write_file(sys.path() / "devices/system/node/node0/cpulist", "0-3\n");
  write_file(sys.path() / "devices/system/node/node1/cpulist", "4-7\n");
  const BindingFacts facts =
      probe_binding(2, lookup({{"CUDA_VISIBLE_DEVICES", "6,7"}}), sys.path().string());
  EXPECT_EQ(facts.gpu_count, 2);
  EXPECT_EQ(facts.cuda_visible_devices, "6,7");
  EXPECT_EQ(facts.numa_cpus, (std::vector<std::vector<int>>{range(0, 3), range(4, 7)}));
  EXPECT_FALSE(facts.cpus.empty());
}

TEST(ProbeBinding, SparseNodeNumbers) {
  test::TempDir sys;
  write_file(sys.path() / "devices/system/node/online", "0,8\n");
  write_file(sys.path() / "devices/system/node/node0/cpulist", "0-1\n");
  write_file(sys.path() / "devices/system/node/node8/cpulist", "2-3\n");
  const BindingFacts facts = probe_binding(0, lookup({}), sys.path().string());
  ASSERT_EQ(facts.numa_cpus.size(), 9u);
  EXPECT_EQ(facts.numa_cpus[0], range(0, 1));
  EXPECT_EQ(facts.numa_cpus[8], range(2, 3));
  EXPECT_TRUE(facts.numa_cpus[4].empty());
  EXPECT_EQ(numa_nodes_of({3}, facts.numa_cpus), std::vector<int>{8});
  EXPECT_EQ(facts.cuda_visible_devices, std::nullopt);
}

TEST(ProbeBinding, NoOrBrokenNumaInformationIsUnknown) {
  test::TempDir empty;
  EXPECT_TRUE(probe_binding(0, lookup({}), empty.path().string()).numa_cpus.empty());
  test::TempDir broken;
  write_file(broken.path() / "devices/system/node/online", "0-1\n");
  write_file(broken.path() / "devices/system/node/node0/cpulist", "0-3\n");
  write_file(broken.path() / "devices/system/node/node1/cpulist", "garbage\n");
  EXPECT_TRUE(probe_binding(0, lookup({}), broken.path().string()).numa_cpus.empty());
  test::TempDir missing;  // node1 listed online but its directory is gone
  write_file(missing.path() / "devices/system/node/online", "0-1\n");
  write_file(missing.path() / "devices/system/node/node0/cpulist", "0-3\n");
  EXPECT_TRUE(probe_binding(0, lookup({}), missing.path().string()).numa_cpus.empty());
}

TEST(ProbeBinding, CpusAreThisProcesssAffinity) {
  cpu_set_t set;
  CPU_ZERO(&set);
  ASSERT_EQ(::sched_getaffinity(0, sizeof set, &set), 0);
  std::vector<int> expected;
  for (int c = 0; c < CPU_SETSIZE; ++c)
    if (CPU_ISSET(c, &set)) expected.push_back(c);
  EXPECT_EQ(probe_binding(0).cpus, expected);
  // The real machine's phrase names those cores.
  EXPECT_NE(describe_binding(detect_launch(lookup({})), probe_binding(0)).find(format_cpu_list(expected)),
            std::string::npos);
}

}  // namespace
}  // namespace moed::launch
