// What a rank learns from the launcher that started it: which launcher, its
// rank on the host (local rank) and how many ranks share the host. Open MPI's
// mpirun and Slurm's srun each export their own variables.
#pragma once

#include <functional>
#include <optional>
#include <string>

namespace moed::launch {

struct LaunchInfo {
  std::string launcher;  // "mpirun", "slurm" or "none"
  int local_rank = 0;
  int local_size = 1;
  std::string host;
};

using EnvLookup = std::function<std::optional<std::string>(const char*)>;

// From the process environment, or from `env` (tests). Malformed values are
// ignored in favour of the next source, never fatal.
LaunchInfo detect_launch(const EnvLookup& env = {});

}  // namespace moed::launch
