// What the admin socket shows of the control plane, rendered as JSON: the
// placement, a summary of the routing statistics, a re-optimisation's
// predicted cost, and the running or last migration. Pure functions.
#pragma once

#include <nlohmann/json.hpp>

#include <optional>

#include "common/process_memory.h"
#include "placement/cost_model.h"
#include "placement/placement.h"
#include "routing/routing_stats.h"
#include "runtime/control/migration_coordinator.h"

namespace moed::runtime {

nlohmann::json placement_json(const placement::Placement& p);
// Per layer: tokens, the hottest expert and its load over the mean, the most
// co-activated pair.
nlohmann::json stats_summary(const routing::RoutingStats& stats);
// Each cost figure now and after, as {"now": x, "after": y}.
nlohmann::json predicted_json(const placement::Cost& now, const placement::Cost& after);
// null when no migration has run.
nlohmann::json migration_json(const MigrationRecord* migration);
// The rank's resident memory for status: after the load, now, and the peak
// since the load (since the start where the kernel would not reset it);
// null where /proc does not say.
nlohmann::json memory_json(const std::optional<ProcessMemory>& after_load, const std::optional<ProcessMemory>& now,
                           bool peak_since_load);

}  // namespace moed::runtime
