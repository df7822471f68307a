// Routing statistics for placement tests: `layers` layers of 4 experts in
// which expert 0 takes `hot` times the load of each other (10 choices each
// per unit of load). Header only.
#pragma once

#include <cstdint>

#include "routing/routing_stats.h"

namespace moed::placement::test_stats {

inline routing::RoutingStats hot_expert(int layers, int hot) {
  routing::RoutingStats stats(layers, 4, 0);
  for (int l = 0; l < layers; ++l)
    for (std::uint32_t e = 0; e < 4; ++e)
      for (int n = 0; n < (e == 0 ? hot : 1) * 10; ++n) {
        const std::uint32_t one[] = {e};
        stats.add_choice(l, one);
      }
  return stats;
}

}  // namespace moed::placement::test_stats
