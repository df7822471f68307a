#include "runtime/control/reoptimizer.h"

#include <exception>

#include "placement/optimizer.h"
#include "placement/redundancy.h"
#include "placement/shard_choice.h"
#include "placement/shard_rules.h"

namespace moed::runtime {

ReoptimizePlan plan_reoptimization(const routing::RoutingStats& stats, const placement::Placement& current,
                                   const placement::Topology& topology, const ReoptimizeRequest& request) {
  try {
    placement::OptimizeOptions options;
    options.policy = request.policy;
    options.slots_per_rank = request.slots_per_rank;
    options.redundant_slots = request.redundant_slots;
    options.load_cap = request.load_cap;
    options.pooled_share = request.pooled_share;
    options.island_tolerance = request.island_tolerance;
    options.expert_groups = request.expert_groups;
    options.group_hint = request.group_hint;
    placement::Optimized optimized = placement::optimize_explained(stats, topology, options);
    placement::Placement next = std::move(optimized.placement);
    const placement::ShardRule rule{request.shard_over_mean, request.shards, double(request.slots_per_rank),
                                    request.shard_per_island};
    if (rule.over_mean > 0) next = placement::split_hot_experts(next, stats, topology, rule);
    next = placement::relabel_to_minimise_moves(current, next, topology);
    next = placement::keep_splits(current, std::move(next));
    // After the splits kept: a split expert short of islands is refused, naming it.
    next = placement::add_island_redundancy(next, stats, topology, request.redundancy);
    if (request.ffn_chunks > 0) placement::check_shards(next, request.ffn_chunks, topology, "the re-optimised placement");
    const routing::RoutingTrace sample = stats.sample_trace();
    if (request.max_moves) next = placement::limit_moves(current, next, *request.max_moves, sample, topology);
    ReoptimizePlan plan;
    if (optimized.pooling) plan.pooling = optimized.pooling->describe();
    plan.moves = placement::moves(current, next);
    plan.now = placement::evaluate(sample, current, topology);
    plan.after = placement::evaluate(sample, next, topology);
    return plan;
  } catch (const std::exception& e) {
    ReoptimizePlan failed;
    failed.error = e.what();
    return failed;
  }
}

}  // namespace moed::runtime
