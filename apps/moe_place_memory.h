// `moe-place memory`: what each rank of a deployment holds, from a moed config
// (and optionally a model card), for moed's CPU path or for GPUs; the fewest
// GPUs of a size that hold it; the activation facts and the attention side.
// The model of memory is placement/memory_plan.h (the daemon's too).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace moed::apps {

struct MemoryArgs {
  std::string config, card, placement, policy, target, dtype, gpu_memory;
  std::vector<std::string> sets;
  int ranks = 0, islands = 0, ranks_per_island = 0;
  std::int64_t tokens_per_step = -1;  // -1: the config's
  std::int64_t migration_in = 1, migration_out = 1;  // slots one migration moves into and out of a rank
  double overhead_mb = -1;            // -1: the target's default
  std::uint64_t context = 32768, sequences = 1;
  bool fewest_gpus = false, json = false;
};

// Prints the plan to stdout; Usage and Input errors for bad flags and files.
int memory_cmd(const MemoryArgs& args);

}  // namespace moed::apps
