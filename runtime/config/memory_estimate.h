// The memory a rank will hold, estimated from the config before anything
// large is allocated, so that sizes the config allows but the host cannot
// hold are refused naming the keys to change (not a std::bad_alloc, exit 1).
// The model of memory is placement/memory_plan.h, which `moe-place memory`
// plans with too; here a config becomes its inputs. The start-up check
// counts the weights of the rank's slots, the gates, the step's buffers at
// its share of the tokens (routing taken as balanced; with the front door,
// its [ingress].max_tokens_per_step), the expert calls' scratch and the
// statistics. It leaves out the process itself (MPI's and UCX's buffers, the
// allocator's slack) and a migration's window, so that it errs low and a
// refusal is no false alarm; the planner adds them.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/available_memory.h"
#include "placement/memory_plan.h"
#include "runtime/config/config.h"

namespace moed::runtime {

using placement::MemoryEstimate;
using placement::MemoryPart;

// The planner's inputs for rank `rank` of `ranks`, holding `slots` whole
// expert slots, on moed's CPU path (experts in fp32). Neither a migration
// nor the process is counted: the caller sets those.
placement::RankMemoryInputs rank_memory_inputs(const Config& c, std::uint64_t slots, int ranks, int rank);
// The same for what a rank holds by shard count (placement::slot_groups):
// a shard of a split expert counts 1/S of its weights.
placement::RankMemoryInputs rank_memory_inputs(const Config& c, std::vector<placement::SlotGroup> slots, int ranks,
                                               int rank);

// What the moed process holds beside what the lines count, on the CPU path:
// code, Open MPI, UCX, OpenBLAS, hwloc and the allocator's slack, measured as
// the resident memory of a rank serving a tiny model (docs/memory-planning.md).
std::uint64_t cpu_process_overhead_bytes();

// One serving rank holding `slots` expert slots, in a job of `ranks`.
MemoryEstimate estimate_rank_memory(const Config& c, std::uint64_t slots, int ranks, int rank = 0);
MemoryEstimate estimate_rank_memory(const Config& c, std::vector<placement::SlotGroup> slots, int ranks, int rank);
// What a rank's GPU holds under [experts].device = cuda: the expert slots,
// shared experts and dense layers in their format (the executors copy each
// one the first time a step uses it, so all of them in the end), the two
// executors' block buffers (rows, up-projection, one chunk's output), and
// the route stage's: every layer's router weights (gate, norm, biases;
// counted even where a router policy keeps routing on the CPU) and its step
// buffers. It
// leaves out the CUDA context and cuBLAS's workspace, so that it errs low.
MemoryEstimate estimate_device_memory(const Config& c, std::vector<placement::SlotGroup> slots, int ranks, int rank);
// `moed --generate-weights`: the whole model, held until written.
MemoryEstimate estimate_generate_memory(const Config& c);

// A Usage error when `copies` x the estimate exceeds `available`: the bytes
// needed and available, and the largest parts with their keys. `who` says
// whose memory it is ("this rank", "--generate-weights").
void check_memory_fits(const MemoryEstimate& estimate, int copies, const AvailableMemory& available,
                       const std::string& who);
// The same against this host's available_memory() (nothing refused when unknown).
void refuse_if_too_large(const MemoryEstimate& estimate, int copies, const std::string& who);

}  // namespace moed::runtime
