// detect_launch: which launcher started the rank, its local rank and local size,
// read from a fake environment.
#include "launch/launch_env.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <map>
#include <optional>
#include <string>

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

}  // namespace
}  // namespace moed::launch
