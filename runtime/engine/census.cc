#include "runtime/engine/census.h"

#include <algorithm>

namespace moed::runtime {

LayerCensus::LayerCensus(int ranks, std::size_t passes, int experts)
    : ranks_(std::size_t(ranks)),
      passes_(passes),
      experts_(std::size_t(experts)),
      mine_(passes * width()),
      all_(ranks_ * passes * width()) {}

std::span<std::uint32_t> LayerCensus::write(std::size_t m, const Routing& routing, std::size_t first, std::size_t n,
                                            std::uint64_t first_key) {
  const std::span<std::uint32_t> block(mine_.data() + m * width(), width());
  ExpertCounts::count(routing, first, n, block.first(experts_));
  block[experts_ + kTokens] = std::uint32_t(n);
  block[experts_ + kKeyLow] = std::uint32_t(first_key);
  block[experts_ + kKeyHigh] = std::uint32_t(first_key >> 32);
  const std::span<std::uint32_t> slots = block.subspan(experts_ + kSlots);
  std::fill(slots.begin(), slots.end(), kNoTrace);
  return slots;
}

void LayerCensus::gather(comm::Transport& transport, const std::string& what) {
  transport.all_gather(mine_.data(), mine_.size() * sizeof(std::uint32_t), all_.data(), what);
}

void LayerCensus::read(std::size_t m, ExpertCounts& counts, PassHomes& homes) const {
  homes.first_key.resize(ranks_);
  homes.tokens.resize(ranks_);
  for (std::size_t r = 0; r < ranks_; ++r) {
    const std::uint32_t* b = block(int(r), m);
    std::copy(b, b + experts_, counts.data() + r * experts_);
    homes.tokens[r] = b[experts_ + kTokens];
    homes.first_key[r] = first_key(int(r), m);
  }
}

std::uint64_t LayerCensus::first_key(int rank, std::size_t m) const {
  const std::uint32_t* b = block(rank, m);
  return std::uint64_t(b[experts_ + kKeyLow]) | (std::uint64_t(b[experts_ + kKeyHigh]) << 32);
}

std::span<const std::uint32_t> LayerCensus::trace_slots(int rank, std::size_t m) const {
  return {block(rank, m) + experts_ + kSlots, kTraceSlots};
}

}  // namespace moed::runtime
