// Checks shared by the tests of routing statistics and of their file:
// feeding paths the way the daemon does, and comparing every statistic.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <span>
#include <vector>

#include "routing/routing_stats.h"

namespace moed::routing::checks {

using Experts = std::vector<std::uint32_t>;

// A token's experts per layer, fed the way the daemon does: choices per
// layer, transitions between consecutive layers, the path into the sample.
inline void feed(RoutingStats& stats, const std::vector<Experts>& path) {
  std::vector<std::span<const std::uint32_t>> spans;
  for (std::size_t l = 0; l < path.size(); ++l) {
    stats.add_choice(static_cast<int>(l), path[l]);
    if (l + 1 < path.size()) stats.add_transition(static_cast<int>(l), path[l], path[l + 1]);
    spans.emplace_back(path[l]);
  }
  stats.add_sample(spans);
}

// Every accessor of two statistics of one shape, compared with `check`.
template <class Check>
void for_every_value(const RoutingStats& a, const RoutingStats& b, Check check) {
  ASSERT_EQ(a.layers(), b.layers());
  ASSERT_EQ(a.experts(), b.experts());
  for (int l = 0; l < a.layers(); ++l) {
    check(a.tokens(l), b.tokens(l), "tokens", l, 0, 0);
    for (int x = 0; x < a.experts(); ++x) {
      check(a.load(l, x), b.load(l, x), "load", l, x, 0);
      for (int y = 0; y < a.experts(); ++y) {
        check(a.coactivation(l, x, y), b.coactivation(l, x, y), "coactivation", l, x, y);
        if (l + 1 < a.layers()) check(a.affinity(l, x, y), b.affinity(l, x, y), "affinity", l, x, y);
      }
    }
  }
}

inline void expect_identical(const RoutingStats& a, const RoutingStats& b) {
  for_every_value(a, b, [](double x, double y, const char* what, int l, int i, int j) {
    EXPECT_EQ(x, y) << what << " (" << l << ", " << i << ", " << j << ")";
  });
}

inline void expect_close(const RoutingStats& a, const RoutingStats& b, double relative) {
  for_every_value(a, b, [relative](double x, double y, const char* what, int l, int i, int j) {
    EXPECT_NEAR(x, y, relative * std::max(std::abs(x), std::abs(y)))
        << what << " (" << l << ", " << i << ", " << j << ")";
  });
}

}  // namespace moed::routing::checks
