// Synthetic routing traces of any shape, for placement experiments at sizes
// no test machine can serve (DeepSeek-V3: 58 layers x 256 experts, top-8).
//
// Every layer routes with the same topic mixture (routing/topic_mixture.h),
// relabelled by a per-layer permutation of experts, so each layer has its own
// co-routed groups and the same load skew. A token draws a topic and keeps it
// from layer to layer with probability `topic_persistence` (this gives
// next-layer affinity), else draws a new one. Gate weights fall with rank.
// With `expert_loads`, each layer instead has topics of its own, and each
// expert's share of the load follows the given loads (TopicMixture::
// fitted_to_loads), such as one text domain's measured counts: two specs
// that differ only in their loads route with the same co-routed groups and
// different hot experts, as two domains of one model do.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "routing/routing_trace.h"

namespace moed::routing {

struct SyntheticRoutingSpec {
  int layers = 1, experts = 8, top_k = 2;
  int topic_size = 0;          // 0: 2 x top_k
  double cross_topic = 0.1;    // chance that a choice leaves the topic
  double hot_ratio = 2.75;     // hottest expert's load over the mean
  double topic_persistence = 0.8;
  std::uint64_t seed = 1;
  // Per layer, a relative load per expert (hot_ratio is then unused); empty:
  // every layer the calibrated mixture, relabelled. Usage error unless it has
  // `layers` rows of `experts` loads.
  std::vector<std::vector<double>> expert_loads{};
  // DeepSeek-V3's group-limited routing: experts in `groups` groups of
  // consecutive ids (n_group), and each token's experts in at most
  // `groups_kept` of them (topk_group): the groups of its first choices,
  // in order, the later choices outside them drawn again inside. 0: none.
  int groups = 0, groups_kept = 0;
};

// Tokens [first, first + count) of the endless token stream of `spec`:
// token i is a pure function of (spec, i), so disjoint ranges are
// independent samples (fit on one, evaluate on another).
RoutingTrace synthetic_routing(const SyntheticRoutingSpec& spec, std::size_t first, std::size_t count);

}  // namespace moed::routing
