#include "runtime/control/snapshot_answer.h"

#include <memory>
#include <optional>
#include <string>

#include "common/error.h"
#include "routing/stats_file.h"
#include "runtime/control/control_views.h"

namespace moed::runtime {

using nlohmann::json;

json snapshot_answer(const Snapshot& snapshot, const admin::Request& request) {
  const std::string& cmd = request.cmd;
  if (cmd == "stats") {
    const std::shared_ptr<const routing::RoutingStats> stats = snapshot.last_stats();
    if (!stats)
      return admin::error_body(admin::code::kRefused,
                               "no statistics gathered yet (rank 0 gathers every [stats].every_steps)");
    json answer = stats_summary(*stats, snapshot.layer_numbers());
    if (request.params.contains("dump")) {
      const std::string path = request.params["dump"];
      try {
        routing::write_stats_file(*stats, path);
      } catch (const Error& e) {
        return admin::error_body(admin::code::kRefused, e.what());
      }
      answer["dump"] = path;
    }
    return answer;
  }
  if (cmd == "status") {
    json status = snapshot.status();
    if (status.is_null()) return {{"rank", snapshot.rank()}, {"state", "starting"}};
    return status;
  }
  if (cmd == "metrics") {
    std::optional<std::string> text = snapshot.metrics_text();
    if (!text) return admin::error_body(admin::code::kRefused, "no figures yet: metrics come from rank 0 after the warm-up");
    return {{"text", std::move(*text)}};
  }
  if (cmd == "placement") return snapshot.placement();
  if (cmd == "migration") {
    json migration = snapshot.migration();
    if (migration.is_null()) return admin::error_body(admin::code::kRefused, "no migration has run (ask rank 0)");
    if (request.params.contains("migration_id") && request.params["migration_id"] != migration["id"])
      return admin::error_body(admin::code::kRefused, fmt::format("the last migration is {}", migration["id"].dump()));
    return {{"migration", migration}};
  }
  return admin::error_body(admin::code::kInternal, "command " + cmd + " has no snapshot");
}

}  // namespace moed::runtime
