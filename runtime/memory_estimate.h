// The memory a rank will hold, estimated from the config before anything
// large is allocated, so that sizes the config allows but the host cannot
// hold are refused naming the keys to change (not a std::bad_alloc, exit 1).
// Counted: the weights of the rank's slots, the gates, the step's buffers at
// its share of the tokens (routing taken as balanced; with the front door,
// its [ingress].max_tokens_per_step) and the expert calls' scratch. Left out:
// the allocator's slack, MPI's and UCX's own buffers, a migration's window,
// so the estimate errs low and a refusal is no false alarm.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/available_memory.h"
#include "runtime/config.h"

namespace moed::runtime {

struct MemoryPart {
  std::string what;  // e.g. "expert weights: 4 slots x 3 x [model].hidden 64 x [model].ffn 96 x 4 bytes"
  std::string keys;  // the keys that size it, for the remedy
  std::uint64_t bytes = 0;
};

struct MemoryEstimate {
  std::vector<MemoryPart> parts;
  std::uint64_t total() const;  // saturating
};

// One serving rank holding `slots` expert slots, in a job of `ranks`.
MemoryEstimate estimate_rank_memory(const Config& c, std::uint64_t slots, int ranks);
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
