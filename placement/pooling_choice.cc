// choose_pooled_share (optimizer.h): metis's pooled share by k-fold
// cross-validation on the statistics' sample.
#include <fmt/format.h>

#include <algorithm>

#include "placement/cost_model.h"
#include "placement/optimizer.h"

namespace moed::placement {

namespace {

struct Fold {
  routing::RoutingStats fit;
  std::size_t judged_first, judged_count;
};

// Tokens [first, end) of `trace` but [skip, skip + skipped), as a trace.
routing::RoutingTrace without(const routing::RoutingTrace& trace, std::size_t first, std::size_t end,
                              std::size_t skip, std::size_t skipped) {
  routing::RoutingTrace out(trace.layers(), trace.experts());
  out.append(trace, first, skip);
  out.append(trace, skip + skipped, end);
  return out;
}

// `trace` on `layers` alone (in that order), as a trace of their own.
routing::RoutingTrace on_layers(const routing::RoutingTrace& trace, const std::vector<int>& layers) {
  routing::RoutingTrace out(int(layers.size()), trace.experts());
  std::vector<std::vector<routing::RoutingChoice>> path(layers.size());
  for (std::size_t t = 0; t < trace.tokens(); ++t) {
    for (std::size_t i = 0; i < layers.size(); ++i) {
      auto cell = trace.at(t, layers[i]);
      path[i].assign(cell.begin(), cell.end());
    }
    out.add_token(path);
  }
  return out;
}

}  // namespace

std::vector<int> pooling_layers(int layers) {
  const int n = std::min(layers, kMaxPoolingLayers);
  std::vector<int> out;
  for (int i = 0; i < n; ++i) out.push_back(int((2 * std::int64_t(i) + 1) * layers / (2 * std::int64_t(n))));
  return out;
}

std::string PoolingChoice::describe() const {
  if (tokens == 0)
    return fmt::format("pooled share {:.2f}: too few sampled tokens to choose it ({} are needed: {} per expert of a "
                       "layer in each of {} blocks)",
                       share, tokens_needed, kMinPairsPerExpert, kPoolingFolds);
  std::string tried;
  for (const PoolingTrial& t : front)
    tried += fmt::format("; {:.2f}: {:.4f} x-isl, load {:.3f}", t.share, t.cross_island_copies_per_token,
                         t.max_mean_rank_load);
  return fmt::format("{} (load cap {:.3f} over greedy-load's {:.3f}), judged on {} sampled tokens in {} blocks "
                     "and {} layers [greedy-load: {:.4f} x-isl, load {:.3f}{}]",
                     load_only ? "greedy-load's placement, the fewest cross-island copies within the load cap"
                               : fmt::format("pooled share {:.2f}, the fewest cross-island copies within the load cap",
                                             share),
                     load_cap, balanced_load, tokens, kPoolingFolds, layers, balanced_copies, balanced_load, tried);
}
PoolingChoice choose_pooled_share(const routing::RoutingStats& stats, const Topology& topology,
                                  const OptimizeOptions& options) {
  PoolingChoice choice;
  choice.load_cap = options.load_cap;
  const std::vector<int> layers = pooling_layers(stats.layers());
  const routing::RoutingTrace sample = on_layers(stats.sample_trace(), layers);
  const std::size_t block = sample.tokens() / kPoolingFolds;
  const std::size_t top_k = std::size_t(std::max(sample.top_k(), 1)), experts = std::size_t(stats.experts());
  choice.tokens_needed = kPoolingFolds * ((kMinPairsPerExpert * experts + top_k - 1) / top_k);
  if (block * top_k < kMinPairsPerExpert * experts) return choice;
  choice.tokens = kPoolingFolds * block;
  choice.layers = int(layers.size());
  const std::size_t oldest = sample.tokens() - kPoolingFolds * block;  // the tokens left over: the oldest
  std::vector<Fold> folds;
  for (std::size_t k = 0; k < kPoolingFolds; ++k) {
    const std::size_t first = oldest + k * block;
    const routing::RoutingTrace rest = without(sample, oldest, sample.tokens(), first, block);
    folds.push_back({routing::RoutingStats::from_trace(rest, 0, rest.tokens()), first, block});
  }
  auto judged = [&](const Fold& f, const OptimizeOptions& o) {
    return evaluate(sample, f.judged_first, f.judged_count, optimize(f.fit, topology, o), topology);
  };
  const double share_of_fold = 1.0 / double(kPoolingFolds);
  OptimizeOptions o = options;
  o.affinity = false;  // the layers judged are not consecutive
  o.policy = OptimizerPolicy::greedy_load;
  for (const Fold& f : folds) {
    const Cost c = judged(f, o);
    choice.balanced_load += c.max_mean_rank_load * share_of_fold;
    choice.balanced_copies += c.cross_island_copies_per_token * share_of_fold;
  }
  o.policy = OptimizerPolicy::metis;
  for (double share : kPooledShares) {
    o.pooled_share = share;
    PoolingTrial t{share};
    for (const Fold& f : folds) {
      const Cost c = judged(f, o);
      t.cross_island_copies_per_token += c.cross_island_copies_per_token * share_of_fold;
      t.max_mean_rank_load += c.max_mean_rank_load * share_of_fold;
    }
    t.within_cap = t.max_mean_rank_load <= choice.balanced_load + options.load_cap;
    choice.front.push_back(t);
  }
  const PoolingTrial* best = nullptr;
  for (const PoolingTrial& t : choice.front) {
    if (!t.within_cap) continue;
    if (!best || t.cross_island_copies_per_token < best->cross_island_copies_per_token ||
        (t.cross_island_copies_per_token == best->cross_island_copies_per_token &&
         t.max_mean_rank_load < best->max_mean_rank_load))
      best = &t;
  }
  if (best) choice.share = best->share;
  choice.load_only = !best || choice.balanced_copies < best->cross_island_copies_per_token;
  return choice;
}

}  // namespace moed::placement
