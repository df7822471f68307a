// The figures of a run (rank 0): tokens/s, step latency, all-to-all latency,
// activation rate, expert load spread, bytes by link class. Printed per step
// and as a summary at exit, and written as one JSON object.
//
// A daemon serves for months, so nothing here grows with the steps served:
// sums are running sums, latency percentiles come from streaming histograms
// (QuantileHistogram: since start, within 0.55%), and the expert loads are
// kept for the last [metrics].load_window_steps steps only, in a ring with a
// running sum. add_step and summary cost the same on the first step and the
// millionth.
#pragma once

#include <array>
#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "common/quantile_histogram.h"
#include "common/recent_samples.h"
#include "runtime/engine/step_record.h"
#include "runtime/weights/model.h"
#include "runtime/observe/rank_signals.h"

namespace moed::runtime {

struct RunInfo {
  int ranks = 1, islands = 1;
  ModelShape shape;
  std::uint64_t tokens_per_step = 0, steps = 0, warmup_steps = 0;  // tokens_per_step 0: the front door's vary
  std::string transport, workload, placement, blas, topology;
  bool batch_invariant = false;  // the start-up probe's verdict
  std::string numerics;          // what the bits depend on, and why
  std::string router_policies;   // the router policies on (empty: none)
  std::string control = "mpi";   // what the control collectives ran over after start-up ([comm].control)
  std::string experts_device = "cpu";  // where the experts ran ([experts].device, as chosen)
};

// The router policies' figures over the measured steps (rates of what they
// counted; 0 where nothing was counted).
struct RouterFigures {
  RouterCounters counts;
  double dropped_rate = 0, moved_rate = 0;          // of the (token, expert) pairs
  double weight_dropped = 0, weight_moved = 0;      // of the gate-weight mass (1 per token)
  double changed_rate = 0;                          // of the router's own pairs, those bias balancing or the load policy changed
  double flip_rate = 0;                             // tokens whose set differs from their request's previous position's
  std::array<double, 2> jitter_rate{};              // tokens whose set changes under noise kJitterEps[i]
  static RouterFigures from(const RouterCounters& c);
};

// Figures of the measured steps. Step latency and tokens/s are wall time
// from one step's boundary to the next (rank 0's clock), so that the control
// plane, the reductions, the output gather and the statistics count; the
// engine's own time and its phases are means per step, each maxed over ranks.
struct Summary {
  std::uint64_t measured_steps = 0;
  double tokens_per_s = 0;
  double step_p50_ms = 0, step_p99_ms = 0;
  // Per layer, each rank's time idle waiting for rows (dispatch) and then
  // only for answers (combine): the communication the overlap did not hide.
  double rows_wait_p50_ms = 0, rows_wait_p99_ms = 0;
  double answers_wait_p50_ms = 0, answers_wait_p99_ms = 0;
  double engine_ms = 0;  // mean per step; its phases (see StepRecord):
  double route_ms = 0, plan_ms = 0, rows_wait_ms = 0, experts_ms = 0, shared_ms = 0, answers_wait_ms = 0, other_ms = 0;
  double bytes_copied = 0;  // per step, all ranks: rows packed, gathered for GEMMs, fp32 answers, answers narrowed
  double activation_rate = 0;          // experts run per token over all experts
  double experts_per_token = 0;        // per layer
  double rows_per_step = 0;            // rows served per step over all layers and ranks (mean)
  double load_std_over_mean = 0;       // mean over layers, window of the last steps
  double load_max_over_mean = 0;       // hottest expert, mean over layers
  double tokens_served = 0;            // tokens that passed every layer in the measured steps
  // The same latencies and rate over the last [metrics].recent_steps
  // measured steps only (the alerts look at these).
  double recent_tokens_per_s = 0;
  double recent_step_p50_ms = 0, recent_step_p99_ms = 0;
  double recent_rows_wait_p50_ms = 0, recent_rows_wait_p99_ms = 0;
  double recent_answers_wait_p50_ms = 0, recent_answers_wait_p99_ms = 0;
  // Per layer, over the load window: the activation rate, the load spread,
  // the hottest experts, and how the experts' loads over the mean fall into
  // kLoadBuckets (counts of experts at or below each bound, cumulative).
  static constexpr std::array<double, 7> kLoadBuckets{0.25, 0.5, 1, 1.5, 2, 3, 4};
  struct HotExpert {
    int expert = 0;
    double over_mean = 0;
  };
  struct Layer {
    int model_layer = 0;  // the model's number of this MoE layer (what metrics and alerts show)
    double activation_rate = 0, load_std_over_mean = 0, load_max_over_mean = 0;
    std::vector<HotExpert> hot;  // hottest first, [metrics].hot_experts of them (fewer if E is smaller)
    std::array<std::uint64_t, kLoadBuckets.size()> at_or_below{};
    std::uint64_t experts = 0;  // the layer's experts (the +Inf bucket)
  };
  std::vector<Layer> layers;
  std::array<std::uint64_t, placement::kLinkClasses> bytes{};
  std::uint64_t saturated = 0;
  bool router_policies = false;  // any on: `router` holds their figures
  RouterFigures router;
  // Expert output terms that were NaN or inf since start (the warm-up
  // included: a wrong answer is one whenever it is served), in all and per
  // expert with any, in (layer, expert) order.
  struct ExpertTerms {
    int layer = 0, expert = 0;
    std::uint64_t terms = 0;
  };
  std::uint64_t nonfinite = 0;
  std::vector<ExpertTerms> nonfinite_by_expert;
  // The golden signals per rank (runtime/observe/rank_signals.h); empty when the
  // steps carried no per-rank figures.
  std::vector<RankFigures> ranks;
};

class Report {
 public:
  // load_window_steps: the window of the expert loads; recent_steps: of the
  // recent rates and latencies; hot_experts: how many per layer Summary names.
  Report(RunInfo info, int load_window_steps, int recent_steps = 32, int hot_experts = 3);

  // At every step boundary (and once at the end), with rank 0's clock in
  // seconds: closes the wall time of the step before, if it was measured.
  void boundary(double now);
  // One step's record, already reduced over ranks (max of times, sum of bytes).
  void add_step(std::uint64_t step, const StepRecord& rec);
  // Elastic serving: the job goes on as `ranks` ranks on `topology` (the
  // survivors of a loss). The per-rank signals start again over them; the
  // job's figures go on.
  void continue_with_ranks(int ranks, std::string topology);
  std::string step_line(std::uint64_t step, const StepRecord& rec) const;
  Summary summary() const;
  std::uint64_t steps_served() const { return served_; }  // the warm-up included
  // The steps and samples held in the windows (load, recent, per rank): once
  // they are full, the same on the thousandth step and the millionth (in the
  // JSON as retained_samples, which mpi.long_run compares).
  std::size_t retained_samples() const;
  void print(std::ostream& os) const;
  nlohmann::json to_json() const;
  void write_json(const std::string& path) const;
  // The placement served at the end, when live migration changed it.
  void set_placement(std::string description) { info_.placement = std::move(description); }

 private:
  nlohmann::json window_load_json() const;

  RunInfo info_;
  int window_, hot_experts_, recent_steps_;
  std::uint64_t served_ = 0;  // steps served, warm-up included

  // Measured steps only (after the warm-up).
  std::uint64_t measured_ = 0;
  double time_ = 0;                                   // seconds, summed
  double route_ = 0, plan_ = 0, rows_wait_ = 0, experts_ = 0, shared_ = 0, answers_wait_ = 0, other_ = 0;  // seconds, summed
  std::uint64_t bytes_copied_ = 0;
  std::array<std::uint64_t, placement::kLinkClasses> bytes_{};
  std::uint64_t pairs_ = 0, saturated_ = 0, token_layers_ = 0;
  RouterCounters router_;
  QuantileHistogram step_s_, rows_wait_s_, answers_wait_s_;  // seconds
  // Wall time: the step since the last boundary, and the closed steps' sum.
  struct OpenStep {
    bool open = false, measured = false;
    double start = 0;
    std::uint64_t token_layers = 0;
  } open_;
  double wall_time_ = 0;
  std::uint64_t wall_token_layers_ = 0;
  // Expert loads of the last window_ measured steps: ring_[slot] is one step's
  // [layer * experts + e]; window_load_ is their sum.
  std::vector<std::vector<std::uint64_t>> ring_;
  std::size_t ring_next_ = 0;
  std::vector<std::uint64_t> window_load_;
  // Rows served per layer in the same window (ring_tokens_ beside ring_).
  std::vector<std::vector<std::uint64_t>> ring_tokens_;
  std::vector<std::uint64_t> window_tokens_;
  // The recent window: wall time and tokens of the last steps, and the
  // per-layer waits of the last steps.
  RecentSamples recent_wall_, recent_tokens_, recent_rows_wait_, recent_answers_wait_;
  // NaN or inf terms per [layer * experts + e], since start; empty until the first.
  std::vector<std::uint64_t> nonfinite_;
  RankSignals rank_signals_;
};

}  // namespace moed::runtime
