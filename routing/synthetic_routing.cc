#include "routing/synthetic_routing.h"

#include <numeric>

#include "common/rng.h"
#include "routing/topic_mixture.h"

namespace moed::routing {

RoutingTrace synthetic_routing(const SyntheticRoutingSpec& spec, std::size_t first, std::size_t count) {
  const TopicMixture mixture = TopicMixture::calibrate(spec.experts, spec.top_k, spec.topic_size,
                                                       spec.cross_topic, spec.hot_ratio, spec.seed);
  // Layer l routes expert x of the mixture to expert relabel[l][x].
  std::vector<std::vector<int>> relabel(spec.layers, std::vector<int>(spec.experts));
  for (int l = 0; l < spec.layers; ++l) {
    std::iota(relabel[l].begin(), relabel[l].end(), 0);
    Rng rng(hash_combine(spec.seed, hash_combine(hash_name("synthetic-routing-layer"), l)));
    for (int i = spec.experts - 1; i > 0; --i) std::swap(relabel[l][i], relabel[l][rng.below(i + 1)]);
  }
  RoutingTrace trace(spec.layers, spec.experts);
  trace.comments.push_back(
      "synthetic routing: topic mixture, hot_ratio " + std::to_string(spec.hot_ratio) +
      ", topic persistence " + std::to_string(spec.topic_persistence) + ", seed " +
      std::to_string(spec.seed));
  std::vector<int> chosen;
  std::vector<std::vector<RoutingChoice>> path(spec.layers);
  for (std::size_t t = first; t < first + count; ++t) {
    Rng rng(hash_combine(spec.seed ^ 0xA5A5A5A5ull, t));
    int topic = mixture.draw_topic(rng);
    for (int l = 0; l < spec.layers; ++l) {
      if (l > 0 && rng.uniform() >= spec.topic_persistence) topic = mixture.draw_topic(rng);
      mixture.sample_from(topic, rng, chosen);
      path[l].clear();
      // Weights falling with rank: 1, 1/2, 1/3, ... normalised.
      double total = 0;
      for (std::size_t j = 0; j < chosen.size(); ++j) total += 1.0 / double(j + 1);
      for (std::size_t j = 0; j < chosen.size(); ++j)
        path[l].push_back({std::uint32_t(relabel[l][chosen[j]]), float(1.0 / double(j + 1) / total)});
    }
    trace.add_token(path);
  }
  return trace;
}

}  // namespace moed::routing
