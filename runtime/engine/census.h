// The all-gather that opens every layer (LayerCensus): each rank tells every
// rank, per pass (micro-batch), how many of its tokens chose each expert, how
// many tokens the pass holds and the key of the first, and which of them are
// traced. Every rank plans its sends and sizes its receives from it, and
// learns which tokens are traced from the collective it runs anyway.
//
// One rank's block of one pass, in u32 words:
//   counts[experts], tokens, first key (low word, high word),
//   traced[kTraceSlots] (offsets in the pass, kNoTrace where unused);
// the gathered census holds the blocks by rank, then by pass.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "comm/transport.h"
#include "runtime/engine/dispatch_plan.h"
#include "runtime/router/router.h"

namespace moed::runtime {

// Traced tokens a rank may announce per pass: a few words more in the
// all-gather. A pass with more traced rows traces the first ones only.
inline constexpr std::size_t kTraceSlots = 4;
inline constexpr std::uint32_t kNoTrace = 0xFFFFFFFFu;

// Every rank's part of one pass: its first token key and its token count.
struct PassHomes {
  std::vector<std::uint64_t> first_key, tokens;
};

class LayerCensus {
 public:
  // For `ranks` ranks, `passes` passes a layer and `experts` experts.
  LayerCensus(int ranks, std::size_t passes, int experts);

  // Writes this rank's block of pass `m`: tokens [first, first + n) of
  // `routing`, keyed from `first_key`, none traced yet. Returns the block's
  // trace slots, for the tracer to fill.
  std::span<std::uint32_t> write(std::size_t m, const Routing& routing, std::size_t first, std::size_t n,
                                 std::uint64_t first_key);
  // Every rank's blocks (collective; `what` names it in errors).
  void gather(comm::Transport& transport, const std::string& what);

  // After gather(): every rank's counts and part of pass `m`.
  void read(std::size_t m, ExpertCounts& counts, PassHomes& homes) const;
  std::uint64_t first_key(int rank, std::size_t m) const;
  int ranks() const { return int(ranks_); }
  std::span<const std::uint32_t> trace_slots(int rank, std::size_t m) const;

 private:
  static constexpr std::size_t kTokens = 0, kKeyLow = 1, kKeyHigh = 2, kSlots = 3;  // after the counts
  std::size_t width() const { return experts_ + kSlots + kTraceSlots; }
  const std::uint32_t* block(int rank, std::size_t m) const {
    return all_.data() + (std::size_t(rank) * passes_ + m) * width();
  }

  std::size_t ranks_, passes_, experts_;
  std::vector<std::uint32_t> mine_, all_;  // this rank's blocks; every rank's
};

}  // namespace moed::runtime
