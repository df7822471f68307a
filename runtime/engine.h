// The step loop of one rank: for every MoE layer, route -> plan -> dispatch ->
// experts -> combine, over a Transport. Every rank runs the same sequence of
// collectives, so no rank needs to be told what to do mid-step.
//
// Two ways to be fed: a built-in workload's tokens pass through every layer
// in one step (run_step), or the front door's tokens come with their layer,
// each layer's own rows in the same step (agree_layer_counts, run_layers).
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "comm/transport.h"
#include "kernels/cpu/fixed_order_gemm.h"
#include "placement/placement.h"
#include "placement/routing_stats.h"
#include "placement/token_paths.h"
#include "placement/topology.h"
#include "runtime/dispatch_plan.h"
#include "runtime/expert_executor.h"
#include "runtime/router.h"
#include "runtime/weights/expert_store.h"
#include "runtime/workload/token_order.h"
#include "runtime/workload/workload.h"

namespace moed::runtime {

// What one rank measured in one step.
struct StepRecord {
  // Seconds: the engine's work on the step (every layer; not the step
  // boundary, the reductions or the figures around it) and its phases.
  double total = 0, route = 0, plan = 0, dispatch = 0, experts = 0, combine = 0;
  // Per layer: the dispatch and combine exchanges alone (the transport's
  // calls, sizes included, waiting for the slowest rank included; not the
  // packing, parsing or sums around them).
  std::vector<double> dispatch_exchange, combine_exchange;
  std::array<std::uint64_t, placement::kLinkClasses> bytes_sent{};  // by link class
  std::vector<std::uint64_t> expert_load;  // [layer * experts + e], whole job (all-gathered)
  std::uint64_t pairs = 0;                 // (token, expert) pairs over layers, whole job
  std::uint64_t token_layers = 0;          // rows served, summed over layers (this rank; reduced: all)
  std::uint64_t saturated = 0;             // fixed-point terms clamped on this rank
};

class Engine {
 public:
  // `workload`: the built-in tokens of run_step (none with the front door).
  Engine(const Config& config, comm::Transport& transport, const placement::Topology& topology,
         const placement::Placement& placement, const ExpertStore& store, const Workload* workload);

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
  // Every rank's row count per layer, [rank * layers + layer] (collective).
  std::vector<std::uint32_t> agree_layer_counts(const std::vector<LayerRows>& mine, std::uint64_t step);
  // Serves every layer that has rows on some rank, in layer order (collective).
  StepRecord run_layers(std::uint64_t step, std::vector<LayerRows>& layers, const std::vector<std::uint32_t>& counts);

  // Routing statistics to feed with this rank's tokens after every step
  // (none: nullptr). Front-door tokens are followed across layers by
  // (request id, position), at most `follow_tokens` at once.
  void record_stats_into(placement::RoutingStats* stats, std::size_t follow_tokens);

  const std::vector<std::uint32_t>& chunk_rows_of_last_layer() const {
    return executor_.last_chunk_rows();
  }

 private:
  // One hop's buffers: rows out (and in), answers back.
  struct Hop {
    std::vector<std::byte> send, recv, back_send, back_recv;
    comm::ExchangeLayout out, back;
  };
  // Serves `count` rows x of `layer`; first_position orders them step-wide.
  void run_layer(int layer, std::uint64_t step, float* x, std::size_t count, std::uint64_t first_position,
                 StepRecord& rec);
  // Packs and exchanges one hop's rows; returns what arrived.
  ReceivedRows send_rows(const std::vector<RowBatch>& batches, Hop& hop, const std::string& what,
                         StepRecord& rec, double& exchange_seconds);
  // Exchanges the answers to rows received in `hop` (`send`, laid out by
  // hop.back's send half) for the answers to the rows this rank sent.
  void answer(const std::vector<RowBatch>& sent, Hop& hop, const std::vector<std::byte>& send,
              const std::string& what, StepRecord& rec, double& exchange_seconds);
  void record_stats();
  // The workload's tokens (and replayed routing) for this rank's positions.
  void fetch_tokens(std::uint64_t step, float* x);
  void fetch_routing(int layer, Routing& routing) const;

  const Config& config_;
  comm::Transport& transport_;
  const placement::Topology& topology_;
  const placement::Placement& placement_;
  const ExpertStore& store_;
  const Workload* workload_;
  ModelShape shape_;
  RouterParams router_;
  std::uint64_t tokens_per_step_;
  std::uint64_t first_ = 0;
  std::size_t count_ = 0;
  TokenOrder order_;
  std::vector<std::uint64_t> ids_;  // this step's tokens at this rank's positions
  std::vector<kernels::PackedWeights> gate_;  // per layer: the gate [experts, hidden], packed
  ExpertExecutor executor_;

  // Buffers reused from layer to layer.
  std::vector<float> xn_, logits_;
  std::vector<Routing> routing_;  // per layer, this step's local tokens
  placement::RoutingStats* stats_ = nullptr;
  std::optional<placement::TokenPaths> paths_;  // front-door tokens' layers, for stats_
  ExpertCounts counts_;
  bool hierarchical_ = false;
  Hop hop1_, hop2_;
  std::vector<std::uint64_t> size_send_, size_recv_;
  std::vector<std::int64_t> acc_;
};

}  // namespace moed::runtime
