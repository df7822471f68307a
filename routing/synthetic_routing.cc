#include "routing/synthetic_routing.h"

#include <numeric>

#include "common/error.h"
#include "common/rng.h"
#include "routing/topic_mixture.h"

namespace moed::routing {

RoutingTrace synthetic_routing(const SyntheticRoutingSpec& spec, std::size_t first, std::size_t count) {
  const bool loads = !spec.expert_loads.empty();
  if (loads && int(spec.expert_loads.size()) != spec.layers)
    MOED_THROW(Usage, "synthetic routing: expert loads for {} layers, the spec has {}", spec.expert_loads.size(),
               spec.layers);
  // Layer l draws from mixtures[l] (or the one mixture), and routes its
  // expert x to expert relabel[l][x].
  std::vector<TopicMixture> mixtures;
  std::vector<std::vector<int>> relabel(spec.layers, std::vector<int>(spec.experts));
  for (int l = 0; l < spec.layers; ++l) {
    std::iota(relabel[l].begin(), relabel[l].end(), 0);
    if (loads) {
      mixtures.push_back(TopicMixture::fitted_to_loads(spec.experts, spec.top_k, spec.topic_size, spec.cross_topic,
                                                       spec.expert_loads[l], hash_combine(spec.seed, l)));
      continue;  // the loads name the experts: no relabelling
    }
    Rng rng(hash_combine(spec.seed, hash_combine(hash_name("synthetic-routing-layer"), l)));
    for (int i = spec.experts - 1; i > 0; --i) std::swap(relabel[l][i], relabel[l][rng.below(i + 1)]);
  }
  if (!loads)
    mixtures.push_back(TopicMixture::calibrate(spec.experts, spec.top_k, spec.topic_size, spec.cross_topic,
                                               spec.hot_ratio, spec.seed));
  auto mixture_of = [&](int l) -> const TopicMixture& { return mixtures[loads ? std::size_t(l) : 0]; };
  RoutingTrace trace(spec.layers, spec.experts);
  trace.comments.push_back("synthetic routing: topic mixture, " +
                           (loads ? std::string("expert loads given per layer")
                                  : "hot_ratio " + std::to_string(spec.hot_ratio)) +
                           ", topic persistence " + std::to_string(spec.topic_persistence) + ", seed " +
                           std::to_string(spec.seed));
  std::vector<int> chosen;
  std::vector<std::vector<RoutingChoice>> path(spec.layers);
  for (std::size_t t = first; t < first + count; ++t) {
    Rng rng(hash_combine(spec.seed ^ 0xA5A5A5A5ull, t));
    int topic = mixture_of(0).draw_topic(rng);
    for (int l = 0; l < spec.layers; ++l) {
      if (l > 0 && rng.uniform() >= spec.topic_persistence) topic = mixture_of(l).draw_topic(rng);
      // Topics are numbered alike in every layer's mixture (the same count).
      mixture_of(l).sample_from(topic, rng, chosen);
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
