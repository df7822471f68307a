// The traced tokens of one layer pass, as every rank learns them from the
// counts' all-gather, and where this rank writes what it sees of them. The
// layer pass (runtime/engine/layer_pass.h) records legs on the home rank and visits
// on the ranks that compute; it does nothing when it has no PassTrace.
#pragma once

#include <cstddef>
#include <cstdint>
#include <tuple>
#include <utility>
#include <vector>

#include "common/clock.h"
#include "runtime/trace/trace_records.h"

namespace moed::runtime::trace {

// Traced tokens a rank may announce per pass: a few words more in the
// all-gather. A pass with more traced rows traces the first ones only.
inline constexpr std::size_t kTraceSlots = 4;
inline constexpr std::uint32_t kNoTrace = 0xFFFFFFFFu;

struct PassTrace {
  double origin_s = 0;  // the layer's sync point on this rank
  int layer = 0;
  std::vector<std::pair<int, std::uint64_t>> keys;  // (home, key): every rank's traced tokens
  TraceFragments* out = nullptr;
  // Where the answer of each visit and leg goes or comes from: (record, stream, rank).
  std::vector<std::tuple<std::size_t, int, int>> visit_streams, leg_streams;

  bool traced(int home, std::uint64_t key) const {
    for (const auto& [h, k] : keys)
      if (h == home && k == key) return true;
    return false;
  }
  float now_us() const { return float((now_seconds() - origin_s) * 1e6); }
  TraceKey key_of(int home, std::uint64_t key) const { return {key, home, layer}; }
};

}  // namespace moed::runtime::trace
