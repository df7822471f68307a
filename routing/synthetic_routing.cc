#include "routing/synthetic_routing.h"

#include <algorithm>
#include <numeric>

#include "common/error.h"
#include "common/rng.h"
#include "routing/topic_mixture.h"

namespace moed::routing {

namespace {

// Group-limited routing on one token's choices, best first (see the spec).
void limit_groups(std::vector<int>& ids, int experts, int groups, int kept, Rng& rng) {
  const int size = experts / groups;
  std::vector<int> chosen_groups;
  for (int id : ids) {
    const int g = id / size;
    if (int(chosen_groups.size()) < kept && std::find(chosen_groups.begin(), chosen_groups.end(), g) == chosen_groups.end())
      chosen_groups.push_back(g);
  }
  auto allowed = [&](int id) {
    return std::find(chosen_groups.begin(), chosen_groups.end(), id / size) != chosen_groups.end();
  };
  for (std::size_t j = 0; j < ids.size(); ++j) {
    if (allowed(ids[j])) continue;
    int id;
    do id = chosen_groups[rng.below(chosen_groups.size())] * size + int(rng.below(std::uint64_t(size)));
    while (std::find(ids.begin(), ids.end(), id) != ids.end());
    ids[j] = id;
  }
}

}  // namespace

RoutingTrace synthetic_routing(const SyntheticRoutingSpec& spec, std::size_t first, std::size_t count) {
  const bool loads = !spec.expert_loads.empty();
  if (spec.groups || spec.groups_kept) {
    if (spec.groups < 1 || spec.experts % spec.groups != 0)
      MOED_THROW(Usage, "synthetic routing: {} expert groups do not divide {} experts", spec.groups, spec.experts);
    if (spec.groups_kept < 1 || spec.groups_kept > spec.groups ||
        std::int64_t(spec.groups_kept) * (spec.experts / spec.groups) < spec.top_k)
      MOED_THROW(Usage, "synthetic routing: {} kept groups of {} experts cannot hold top-{} (of {} groups)",
                 spec.groups_kept, spec.experts / spec.groups, spec.top_k, spec.groups);
  }
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
  std::vector<int> chosen, ids;
  std::vector<std::vector<RoutingChoice>> path(spec.layers);
  for (std::size_t t = first; t < first + count; ++t) {
    Rng rng(hash_combine(spec.seed ^ 0xA5A5A5A5ull, t));
    int topic = mixture_of(0).draw_topic(rng);
    for (int l = 0; l < spec.layers; ++l) {
      if (l > 0 && rng.uniform() >= spec.topic_persistence) topic = mixture_of(l).draw_topic(rng);
      // Topics are numbered alike in every layer's mixture (the same count).
      mixture_of(l).sample_from(topic, rng, chosen);
      ids.clear();
      for (int x : chosen) ids.push_back(relabel[l][x]);
      if (spec.groups) {
        // A stream of its own, so that the limit leaves the token's other draws as they were.
        Rng redraw(hash_combine(hash_combine(spec.seed, hash_name("expert-groups")), hash_combine(t, std::uint64_t(l))));
        limit_groups(ids, spec.experts, spec.groups, spec.groups_kept, redraw);
      }
      path[l].clear();
      // Weights falling with rank: 1, 1/2, 1/3, ... normalised.
      double total = 0;
      for (std::size_t j = 0; j < ids.size(); ++j) total += 1.0 / double(j + 1);
      for (std::size_t j = 0; j < ids.size(); ++j)
        path[l].push_back({std::uint32_t(ids[j]), float(1.0 / double(j + 1) / total)});
    }
    trace.add_token(path);
  }
  return trace;
}

}  // namespace moed::routing
