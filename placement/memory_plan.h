// The memory one rank holds, line by line: moed's single model of memory.
// The daemon refuses at start a config its host cannot hold with it
// (runtime/config/memory_estimate.h maps a config onto these inputs), and
// `moe-place memory` plans a deployment with it, for moed's CPU path or for
// GPUs. The formula of every line: docs/memory-planning.md.
//
// Pure: sizes from shapes and counts, saturating instead of wrapping.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "placement/placement.h"

#include "placement/weight_format.h"

namespace moed::placement {

struct MemoryPart {
  std::string what;   // e.g. "expert weights: 4 slots x 3 x [model].hidden 64 x [model].ffn 96 x 4 bytes"
  std::string keys;   // the keys that size it, for the remedy
  std::uint64_t bytes = 0;
  std::string group;  // one of memory_groups()
};

struct MemoryEstimate {
  std::vector<MemoryPart> parts;
  std::uint64_t total() const;  // saturating
  std::uint64_t group_total(const std::string& group) const;
};

// The groups of lines, in the order they are printed.
const std::vector<std::string>& memory_groups();

// `count` slots of 1/shards of an expert each: a shard holds F/S columns of
// W1 and W3 and F/S rows of W2 (shards = 1: whole experts).
struct SlotGroup {
  std::uint64_t count = 0;
  std::uint64_t shards = 1;
};

// What `rank` holds in `placement`, grouped by shard count (whole experts
// and replicas first, then each split's shard), ordered by shards.
std::vector<SlotGroup> slot_groups(const Placement& placement, int rank);

struct RankMemoryInputs {
  // The MoE layers' shape; max_k is the most experts a token takes.
  std::uint64_t layers = 0, experts = 0, hidden = 0, ffn = 0, max_k = 0;
  bool expert_bias = false;
  std::uint64_t shared_ffn = 0;     // F of each layer's shared expert, held by every rank (0: none)
  std::uint64_t dense_layers = 0, dense_ffn = 0;  // dense layers served (each held whole by every rank) and their F
  WeightFormat expert_format;       // the experts as held (moed's CPU path: f32)
  std::vector<SlotGroup> slots;     // this rank's
  bool pack_at_load = false;        // fixed-order GEMM: one more slot while one is packed
  bool cpu_router = true;           // the gate as loaded and as packed, and the workload's directions
  // The tokens this rank routes in one step (its share of the workload's, or
  // the front door's budget per rank), and the key that sets them.
  std::uint64_t tokens = 0;
  std::uint64_t ranks = 1;  // a rank's own rows never travel: (ranks - 1) / ranks of its pairs do
  std::string tokens_key = "[workload].tokens_per_step";
  // Slots one migration brings into this rank and sends out of it (0 and 0
  // leave the migration out).
  std::uint64_t migration_in = 0, migration_out = 0;
  // Ranks on one host with UCX over shared memory: a source maps the part of
  // each destination's window it writes, and its resident memory counts it.
  bool maps_peer_windows = false;
  bool keep_window = true;
  // Routing statistics ([stats]), with the rank that gathers and writes them.
  bool stats = false;
  std::uint64_t stats_sample_tokens = 0;      // this rank's share of the sample
  bool gathers_stats = false;
  std::uint64_t gathered_sample_tokens = 0;   // the whole sample, on the rank that gathers
  std::uint64_t load_window_steps = 0;  // rank 0's ring of expert loads ([metrics])
  std::uint64_t trace_tokens = 0;       // a replayed trace, held whole by every rank
  // The process itself (code, MPI, UCX, BLAS, allocator): 0 leaves it out.
  std::uint64_t process_bytes = 0;
  std::string process_what;
};

// Bytes of one slot of 1/shards of an expert in `format`.
std::uint64_t slot_bytes(const RankMemoryInputs& in, std::uint64_t shards = 1);
// Bytes of the statistics' aggregates and sample (routing/routing_stats.h).
std::uint64_t stats_bytes(std::uint64_t layers, std::uint64_t experts, std::uint64_t sample_tokens,
                          std::uint64_t max_k);

MemoryEstimate rank_memory(const RankMemoryInputs& in);

// The estimate by phase of the rank's life: after the load (load_peak is
// the same: the slot packed from stays with the allocator); serving (the
// step buffers); migrating (its window and the arrivals). peak is the
// highest of them, what a budget must hold.
struct MemoryPhases {
  std::uint64_t after_load = 0, load_peak = 0, serving = 0, migrating = 0;
  std::uint64_t peak() const { return load_peak > migrating ? load_peak : migrating; }
};
MemoryPhases phases(const MemoryEstimate& e);

// The fewest ranks, from 1 to max_ranks, whose largest rank fits `budget`
// bytes; `largest_rank(r)` is the estimate of the fullest rank of r.
std::optional<int> fewest_ranks(const std::function<MemoryEstimate(int)>& largest_rank, std::uint64_t budget,
                                int max_ranks);

}  // namespace moed::placement

namespace moed::placement {

// "80" or "80GiB" or "80G" (GiB: GPU memory comes in powers of two), "141GB"
// (10^9), "512MiB", "512M", "512MB". A Usage error naming `flag` otherwise.
std::uint64_t parse_memory_size(const std::string& text, const std::string& flag);

}  // namespace moed::placement
