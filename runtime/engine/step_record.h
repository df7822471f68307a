// What one rank measured in one step (StepRecord), apart from the engine
// that fills it: the report, the signals and the control plane read it
// without knowing the step loop.
#pragma once

#include <array>
#include <cstdint>
#include <utility>
#include <vector>

#include "placement/topology.h"
#include "runtime/router/policies/router_policies.h"
#include "runtime/trace/trace_records.h"

namespace moed::runtime {

// What one rank measured in one step.
struct StepRecord {
  // Seconds: the engine's work on the step (every layer; not the step
  // boundary, the reductions or the figures around it) and its phases:
  // route (norm and router), plan (the counts' all-gather and the plans),
  // experts (the expert calls), rows_wait (idle, waiting for rows),
  // answers_wait (idle, waiting only for answers) and other (packing,
  // parsing, sums and the residual). With overlap the experts run while rows
  // and answers travel, so the waits are what the overlap did not hide.
  double total = 0, route = 0, plan = 0, rows_wait = 0, experts = 0, answers_wait = 0, other = 0;
  // The same two waits, per layer.
  std::vector<double> rows_wait_per_layer, answers_wait_per_layer;
  std::uint64_t bytes_copied = 0;  // rows packed into messages, gathered for GEMMs, fp32 answers, answers narrowed
  std::array<std::uint64_t, placement::kLinkClasses> bytes_sent{};  // by link class
  std::vector<std::uint64_t> expert_load;  // [layer * experts + e], whole job (all-gathered)
  std::uint64_t pairs = 0;                 // (token, expert) pairs over layers, whole job
  std::uint64_t token_layers = 0;          // rows served, summed over layers (this rank; reduced: all)
  std::vector<std::uint64_t> tokens_per_layer;  // rows served per layer (this rank; reduced: all)
  std::uint64_t saturated = 0;             // fixed-point terms clamped on this rank
  RouterCounters router;                   // the router policies' counts (this rank's tokens; reduced: all)
  // Expert output terms that were NaN or inf (their tokens' outputs carry
  // NaN), only for the experts with any: (layer * experts + expert, terms),
  // counted on the rank that computed them (reduced: summed over the job).
  std::vector<std::pair<std::uint32_t, std::uint64_t>> nonfinite;
  // What this rank saw of traced tokens (reduced: every rank's, on rank 0).
  trace::TraceFragments trace;
  // Rank 0 only, per rank (the dashboard's health view), from the plan's
  // census, which every rank has anyway: the loads of the tokens each rank
  // routed [(rank * layers + layer) * experts + e] and its rows per layer
  // [rank * layers + layer]; then, from the figures' gather, each rank's two
  // waits per layer served [rank * layers served + i]. Empty on the other ranks.
  std::vector<std::uint64_t> routed_load_by_rank, routed_rows_by_rank;
  std::vector<double> rows_wait_by_rank, answers_wait_by_rank;

  void add_nonfinite(std::uint32_t layer_expert, std::uint64_t terms) {
    for (auto& [key, n] : nonfinite)
      if (key == layer_expert) {
        n += terms;
        return;
      }
    nonfinite.emplace_back(layer_expert, terms);
  }
};

}  // namespace moed::runtime
