// A traced token's records, as the ranks would send them, for the tests of
// the trace's assembly, JSON and moectl rendering.
#pragma once

#include <cstdint>

#include "runtime/trace/trace_records.h"

namespace moed::runtime::trace {

// A token on home rank 1 in layer `layer`: experts 4 (rank 2, island 1) and 0 (rank 1).
inline TraceFragments token_layer(std::uint64_t request, int layer, std::uint64_t key = 100, double sync_s = 10.0) {
  const TraceKey at{key, 1, layer};
  TraceFragments f;
  HomeRecord h;
  h.at = at;
  h.request_id = request;
  h.position = 0;
  h.step = 7;
  h.epoch = 2;
  h.island = 0;
  h.sync_s = sync_s + layer * 0.001;
  h.route_us = 20, h.gather_us = 5, h.planned_us = 3, h.sent_us = 8, h.combined_us = 300;
  f.homes.push_back(h);
  f.choices.push_back({at, 4, 0.75f});
  f.choices.push_back({at, 0, 0.25f});
  f.legs.push_back({at, 1, 0, 1, 0, 0, 0, 150});
  f.legs.push_back({at, 2, 1, 1, 0, 544, 512, 280});
  f.visits.push_back({at, 2, 1, 4, 6, 40, 60, 200, 210});
  f.visits.push_back({at, 1, 0, 0, 9, 8, 90, 140, 150});
  return f;
}

}  // namespace moed::runtime::trace
