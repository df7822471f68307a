#include "launch/launch_env.h"

#include <unistd.h>

#include <charconv>
#include <cstdlib>
#include <algorithm>

namespace moed::launch {

namespace {

std::optional<int> read_int(const EnvLookup& env, const char* name) {
  auto text = env(name);
  if (!text) return std::nullopt;
  int value = 0;
  auto [end, ec] = std::from_chars(text->data(), text->data() + text->size(), value);
  if (ec != std::errc() || end != text->data() + text->size() || value < 0) return std::nullopt;
  return value;
}

}  // namespace

LaunchInfo detect_launch(const EnvLookup& lookup) {
  EnvLookup env = lookup ? lookup : [](const char* name) -> std::optional<std::string> {
    const char* v = std::getenv(name);
    return v ? std::optional<std::string>(v) : std::nullopt;
  };
  LaunchInfo info;
  char host[256] = {};
  if (::gethostname(host, sizeof host - 1) == 0) info.host = host;

  // mpirun's variables first: inside a Slurm allocation mpirun is still the launcher.
  if (auto lr = read_int(env, "OMPI_COMM_WORLD_LOCAL_RANK")) {
    info.launcher = "mpirun";
    info.local_rank = *lr;
    info.local_size = read_int(env, "OMPI_COMM_WORLD_LOCAL_SIZE").value_or(1);
  } else if (auto lid = read_int(env, "SLURM_LOCALID")) {
    info.launcher = "slurm";
    info.local_rank = *lid;
    // SLURM_TASKS_PER_NODE reads like "4(x2)": the leading count holds for even layouts.
    if (auto tpn = env("SLURM_TASKS_PER_NODE")) info.local_size = std::max(1, std::atoi(tpn->c_str()));
  } else {
    info.launcher = "none";
  }
  if (info.local_size < info.local_rank + 1) info.local_size = info.local_rank + 1;
  return info;
}

}  // namespace moed::launch
