// The step loop of one rank: for every MoE layer, route -> plan -> dispatch ->
// experts -> combine, over a Transport. Every rank runs the same sequence of
// collectives, so no rank needs to be told what to do mid-step.
//
// Two ways to be fed: a built-in workload's tokens pass through every layer
// in one step (run_step), or the front door's tokens come with their layer,
// each layer's own rows in the same step (agree_layer_counts, run_layers).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "comm/transport.h"
#include "placement/placement.h"
#include "placement/topology.h"
#include "routing/routing_stats.h"
#include "routing/token_paths.h"
#include "runtime/config/config.h"
#include "runtime/engine/census.h"
#include "runtime/engine/dispatch_plan.h"
#include "runtime/engine/expert_executor.h"
#include "runtime/engine/layer_pass.h"
#include "runtime/engine/pass_tracer.h"
#include "runtime/engine/route_stage.h"
#include "runtime/engine/step_record.h"
#include "runtime/router/policies/router_policies.h"
#include "runtime/router/router.h"
#include "runtime/trace/trace_selector.h"
#include "runtime/weights/expert_store.h"
#include "runtime/workload/token_order.h"
#include "runtime/workload/workload.h"

namespace moed::runtime {

class Engine {
 public:
  // `workload`: the built-in tokens of run_step (none with the front door);
  // `device`: where the experts run (expert_device.h chooses it), on CUDA
  // device `gpu` under cuda.
  Engine(const Config& config, comm::Transport& transport, const placement::Topology& topology,
         const placement::Placement& placement, const ExpertStore& store, const Workload* workload,
         ExpertDevice device = ExpertDevice::cpu, int gpu = 0);

  // This rank's positions in every step: [first, first + count) of the step's
  // tokens_per_step, split evenly by rank ([workload].order says which token
  // sits at each position).
  std::uint64_t first_token() const { return first_; }
  std::size_t local_tokens() const { return count_; }

  // Serves step `step` of the workload; `hidden` receives the final hidden
  // states of the local tokens.
  StepRecord run_step(std::uint64_t step, std::vector<float>& hidden);

  // One layer's rows on this rank, served in place: x [rows, hidden] holds
  // h and receives h + MoE(RMSNorm(h)). Request ids and positions (rows
  // each) key the routing statistics.
  struct LayerRows {
    float* x = nullptr;
    std::size_t rows = 0;
    const std::uint64_t* request_ids = nullptr;
    const std::uint32_t* positions = nullptr;
  };
  // The layers run_layers serves: the MoE layers, then the dense layers
  // served ([model].serve_dense), each rank's rows on its own.
  int served_layers() const { return shape_.layers + store_.dense_layers(); }
  // Every rank's row count per served layer, [rank * served_layers() + layer] (collective).
  std::vector<std::uint32_t> agree_layer_counts(const std::vector<LayerRows>& mine, std::uint64_t step);
  // Serves every layer that has rows on some rank, in layer order (collective).
  StepRecord run_layers(std::uint64_t step, std::vector<LayerRows>& layers, const std::vector<std::uint32_t>& counts);

  // Elastic serving: a lost peer cut the step short. Closes the passes'
  // exchanges (Transport::continue_with needs none open) and keeps their
  // buffers until the engine is destroyed, after continue_with.
  void abandon_step();

  // Routing statistics to feed with this rank's tokens after every step
  // (none: nullptr). Front-door tokens are followed across layers by
  // (request id, position), at most `follow_tokens` at once.
  void record_stats_into(routing::RoutingStats* stats, std::size_t follow_tokens);

  // Online bias balancing's biases, [layer * experts + e] (empty when off);
  // set: resumed from the statistics file (the same values on every rank).
  std::vector<double> router_biases() const { return route_.policies().biases(); }
  void set_router_biases(std::vector<double> values) { route_.policies().set_biases(std::move(values)); }
  const RouterPolicies& router_policies() const { return route_.policies(); }
  // Traces the tokens `selector` wants (none: nullptr); the selector must
  // decide alike on every rank.
  void trace_with(const trace::TraceSelector* selector) { tracer_.trace_with(selector); }

  // Rows per expert call in the last step, all layers (for the benchmark's bound).
  const std::vector<std::uint32_t>& calls_of_last_step() const { return executor_->calls(); }

 private:
  // Serves `count` rows x of `layer`; first_position orders them step-wide.
  // tags: the rows' requests; rows_of_rank: every rank's row count (the
  // router policies' exchange).
  void run_layer(int layer, std::uint64_t step, float* x, std::size_t count, std::uint64_t first_position,
                 std::span<const TokenTag> tags, std::span<const std::uint32_t> rows_of_rank, StepRecord& rec);
  // What run_step and run_layers open and close a step with.
  StepRecord open_step();
  void close_step(StepRecord& rec);
  // The layer's census: this rank's passes of `routing`, all-gathered.
  void take_census(const Routing& routing, std::size_t count, std::uint64_t first_position,
                   const std::string& where);
  // Every pass planned from the census (and watched, if it traces).
  void plan_passes(int layer, std::uint64_t step, std::size_t count, std::uint64_t first_position,
                   const std::string& where, double sync_s);
  // Runs the passes until all are done, timing the waits.
  void drive_passes(double& rows_wait, double& answers_wait);
  // What the layer measured, into the step's record (and the policies' loads).
  void account_layer(int layer, std::uint64_t step, std::size_t count, const LayerTimes& times, double rows_wait,
                     double answers_wait, StepRecord& rec);
  // The layer's shared expert on this rank's `count` normalised rows, weighted
  // (1, or Qwen2-MoE's sigmoid gate) onto their fixed-point sums: never
  // dispatched, and exact integers whatever else lands on the sums.
  void run_shared_expert(int layer, std::uint64_t step, std::size_t count, StepRecord& rec);
  // An FFN every rank holds whole (a shared expert, a dense layer) on this
  // rank's `count` normalised rows xn, each weighted weight(t) onto its
  // fixed-point sum in acc_; its saturated terms counted into rec;
  // `between_blocks` runs between its row blocks (ExpertExecutor::run).
  template <class Weight>
  ExpertCallCounts run_held(const kernels::ExpertView& ffn, const float* xn, std::size_t count, StepRecord& rec,
                            Weight&& weight, const std::function<void()>& between_blocks);
  // Dense layer d (ExpertStore::dense_ffn) on this rank's `count` rows x, in
  // place: x + FFN(RMSNorm(x)), summed on the fixed-point grid like an MoE layer.
  void run_dense_layer(int d, float* x, std::size_t count, StepRecord& rec);
  // An expert call of `layer` gave `terms` NaN or inf terms.
  void note_nonfinite(int layer, int expert, std::uint64_t terms, std::uint64_t step, StepRecord& rec);
  void start_rank_figures(StepRecord& rec) const;
  void record_stats();
  // The workload's tokens (and replayed routing) for this rank's positions.
  void fetch_tokens(std::uint64_t step, float* x);
  void fetch_routing(int layer, Routing& routing) const;
  // A pass's rows among the layer's `count`: [first, first + n).
  std::pair<std::size_t, std::size_t> pass_rows(std::size_t m, std::size_t count) const {
    return {count * m / passes_.size(), count * (m + 1) / passes_.size() - count * m / passes_.size()};
  }

  const Config& config_;
  comm::Transport& transport_;
  const placement::Topology& topology_;
  const placement::Placement& placement_;
  const ExpertStore& store_;
  const Workload* workload_;
  ModelShape shape_;
  std::uint64_t tokens_per_step_;
  std::uint64_t first_ = 0;
  std::size_t count_ = 0;
  TokenOrder order_;
  std::vector<std::uint64_t> ids_;  // this step's tokens at this rank's positions
  std::unique_ptr<ExpertExecutor> executor_;
  std::unique_ptr<ExpertExecutor> shared_executor_;  // apart, so that calls() stays the routed experts' for the bound
  std::vector<ExpertRow> shared_rows_;
  std::vector<char> warned_shared_;  // [layer]: the shared expert's first NaN/inf was logged
  double shared_s_ = 0;  // the current layer's shared expert time
  std::vector<float> dense_xn_;  // a dense layer's normalised rows
  bool warned_dense_ = false;    // a dense layer's first NaN/inf was logged
  RouteStage route_;
  std::uint64_t positions_per_request_ = 1;
  std::vector<TokenTag> tags_;                 // this layer's (or built-in step's) requests
  std::vector<std::uint32_t> rows_of_rank_;    // built-in: every rank's tokens per step
  std::vector<std::uint32_t> layer_rows_of_rank_;  // front door: every rank's rows of the layer
  std::vector<Routing> routing_;  // per layer, this step's local tokens
  routing::RoutingStats* stats_ = nullptr;
  std::optional<routing::TokenPaths> paths_;  // front-door tokens' layers, for stats_
  double step_start_ = 0;
  // The layer's passes (micro-batches), planned from the census; their sums.
  LayerPass::Setup setup_;
  LayerCensus census_;
  std::vector<ExpertCounts> counts_;        // per pass
  std::vector<LayerPass::Homes> homes_;     // per pass
  std::vector<LayerPass> passes_;
  std::vector<std::int64_t> acc_;
  std::vector<char> warned_nonfinite_;      // [layer * experts + e]: its first NaN/inf was logged
  LayerTracer tracer_;
};

}  // namespace moed::runtime
