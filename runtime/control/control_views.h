// What the admin socket shows of the control plane, rendered as JSON: the
// placement, a summary of the routing statistics, a re-optimisation's
// predicted cost, and the running or last migration. Pure functions. Layers
// are shown by the model's own numbers (`numbers`; common/layer_numbers.h).
#pragma once

#include <nlohmann/json.hpp>

#include "common/layer_numbers.h"
#include "placement/cost_model.h"
#include "placement/placement.h"
#include "routing/routing_stats.h"
#include "runtime/control/migration_coordinator.h"

namespace moed::runtime {

// "slots" and "split" by MoE layer, and "model_layers": each one's number;
// with a group-limited router (DeepSeek's n_group, topk_group: `groups`
// equal groups of experts in id order, a token's from `groups_kept` of
// them), "expert_groups": {"groups", "kept", "size"}.
struct ExpertGroups {
  int groups = 1, kept = 1;
};
// What a slot holds: its experts' format ([experts].dtype) and the bytes of
// one shard of S (1: a whole expert); "slot": {"dtype", "bytes", and
// "shard_bytes": {"S": bytes} for the shard counts the placement has}.
struct SlotFormat {
  std::string dtype;
  placement::SlotBytes bytes;
};
nlohmann::json placement_json(const placement::Placement& p, const LayerNumbers& numbers = {},
                              ExpertGroups groups = {}, const SlotFormat& slot = {});
// Per layer: tokens, the hottest expert and its load over the mean, the most
// co-activated pair.
nlohmann::json stats_summary(const routing::RoutingStats& stats, const LayerNumbers& numbers = {});
// Each cost figure now and after, as {"now": x, "after": y}.
nlohmann::json predicted_json(const placement::Cost& now, const placement::Cost& after);
// null when no migration has run.
nlohmann::json migration_json(const MigrationRecord* migration, const LayerNumbers& numbers = {});
}  // namespace moed::runtime
