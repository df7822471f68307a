// What one rank shows of itself, as last published: status, the metrics
// text, the placement, the migration's progress, the last merged routing
// statistics and (rank 0, with [metrics].listen) the expert heatmap. The
// step thread writes it after each step (and the control plane when a
// decision changes what it shows); the admin socket's and the HTTP
// endpoint's threads read it, and never wait on the step thread's long
// work: every write is a swap under one mutex, and the statistics are
// shared, not copied, so that a dump writes its file without holding it.
//
// The golden-signal alerts are evaluated here, on publish, from the run's
// summary (runtime/observe/alerts.h).
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/process_memory.h"
#include "routing/routing_stats.h"
#include "runtime/config/config.h"
#include "runtime/observe/alerts.h"
#include "runtime/observe/load_heatmap.h"
#include "runtime/observe/prometheus_text.h"
#include "runtime/observe/report.h"

namespace moed::runtime {

// What the control plane publishes of itself after a step.
struct ControlState {
  std::uint64_t step = 0;
  std::string state;         // "serving", "draining" or "stopping"
  nlohmann::json migration;  // rank 0: the running or last migration (migration_json); null before any, elsewhere
  std::optional<std::string> stats_file_alert;  // while the statistics file cannot be written: its alert
  double now = 0;                               // seconds: the alerts' clock
  // The epoch, the migration's bytes and state, the write failures; the
  // alerts' fields are the snapshot's own (filled on publish).
  ControlFigures figures;
};

class Snapshot {
 public:
  // `island_of_rank`: the job's islands (the dashboard shows them).
  Snapshot(const Config& config, int rank, std::vector<int> island_of_rank);

  // The writes, from the step thread.
  //
  // Once start-up has loaded everything: the resident memory then, and the
  // peak reset so that status shows the peak of serving (and migrating).
  void note_loaded();
  // After a step: status and the migration, and, with the run's summary
  // (rank 0 after the warm-up), the alerts and the metrics text.
  void publish(const ControlState& control, const Summary* summary);
  void set_placement(nlohmann::json placement);  // placement_json of the committed placement
  void set_migration(nlohmann::json migration);  // migration_json, visible at once
  void set_stats(std::shared_ptr<const routing::RoutingStats> stats);
  // Rank 0, after each measured step: its expert loads into the heatmap.
  void record_loads(const std::vector<std::uint64_t>& expert_load);
  // The front door: a turn of the step loop found no work on any rank (and
  // this rank waited before the next). Status shows the count as idle_turns.
  void note_idle_turn() { idle_turns_.fetch_add(1, std::memory_order_relaxed); }
  // Elastic serving: a step's answers held back past the fencing lease
  // (served again at the next turn). Status shows the count as lease_expired.
  void note_lease_expired() { lease_expired_.fetch_add(1, std::memory_order_relaxed); }
  // The front door's counters, read when status or the metrics are asked
  // for (any thread): status shows them as "front_door", and the metrics
  // as moed_front_door_* (this rank's).
  void set_front_door_counters(std::function<nlohmann::json()> counters);
  // Elastic serving, after each agreement on the survivors: the epoch, its
  // members (world ranks) and the losses so far (runtime/daemon/elastic.cc).
  // Status shows it as "survivors", with an alert for each loss.
  void set_survivors(nlohmann::json survivors);
  // Elastic serving: this rank became the survivors' rank 0, which keeps
  // the load heatmap for the endpoint it opens (empty until steps add to it).
  void keep_heatmap(const Config& c);

  // The reads, from any thread, as last published.
  int rank() const { return rank_; }
  const std::vector<int>& island_of_rank() const { return island_of_rank_; }
  const LayerNumbers& layer_numbers() const { return numbers_; }  // the model's layer numbers, as answers show them
  nlohmann::json status() const;                  // null before the first publish
  std::optional<std::string> metrics_text() const;  // none before the first measured step, and off rank 0
  nlohmann::json placement() const;
  nlohmann::json migration() const;  // null: no migration has run (or not rank 0)
  std::shared_ptr<const routing::RoutingStats> last_stats() const;  // rank 0: the last merged statistics
  // What the dashboard shows (runtime/observe/http/dashboard_routes.h). The
  // summary is empty before the first measured step.
  struct DashboardView {
    std::optional<Summary> summary;
    nlohmann::json status, placement, migration;
    AlertThresholds thresholds;
  };
  DashboardView dashboard_view() const;
  std::vector<LoadHeatmap::Column> heatmap_layer(int layer) const;
  int heatmap_column_steps() const { return heatmap_.column_steps(); }

 private:
  const int rank_;
  const std::vector<int> island_of_rank_;
  const LayerNumbers numbers_;
  const bool front_door_;                      // status shows idle_turns
  std::atomic<std::uint64_t> idle_turns_{0};  // read without the mutex
  std::atomic<std::uint64_t> lease_expired_{0};
  std::function<nlohmann::json()> front_door_counters_;  // set once, before serving
  AlertBook alert_book_;  // rank 0: the [metrics] alerts (the step thread's; its limits never change)
  std::optional<ProcessMemory> memory_after_load_;
  bool peak_since_load_ = false;

  mutable std::mutex mu_;
  nlohmann::json status_, placement_, migration_, survivors_;
  std::string metrics_;
  std::shared_ptr<const routing::RoutingStats> last_stats_;
  std::optional<Summary> summary_;  // rank 0: the last published figures
  LoadHeatmap heatmap_;             // rank 0 with the endpoint on; empty elsewhere
};

}  // namespace moed::runtime
