// What one rank measured in one step (StepRecord), apart from the engine
// that fills it: the report, the signals and the control plane read it
// without knowing the step loop. And the step's reduction over ranks, pure
// (the daemon gathers the bytes): one list of the figures that ranks combine,
// for_each_figure, which the encoding, the decoding, the max and the sum walk.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
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
  // experts (the routed experts' calls), shared (the shared expert's, on
  // this rank's own rows; part of no other phase), rows_wait (idle, waiting for rows),
  // answers_wait (idle, waiting only for answers) and other (packing,
  // parsing, sums and the residual). With overlap the experts run while rows
  // and answers travel, so the waits are what the overlap did not hide.
  double total = 0, route = 0, plan = 0, rows_wait = 0, experts = 0, shared = 0, answers_wait = 0, other = 0;
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

// How ranks combine a figure: times by their max, counts by their sum.
enum class Combine { max, sum };

// The figures the per-step reduction carries, in their order on the wire:
// `visit(how, field...)` once per figure, with that field of each record
// (one record to encode, two to decode or fold). A figure the ranks must
// combine belongs here; the others (expert_load and pairs, all-gathered
// already; the per-rank census) are rank 0's own. The non-finite counts and
// the traces follow the figures in each rank's block.
template <class Visit, class... Records>
void for_each_figure(Visit&& visit, Records&... r) {
  visit(Combine::max, r.total...);
  visit(Combine::max, r.route...);
  visit(Combine::max, r.plan...);
  visit(Combine::max, r.rows_wait...);
  visit(Combine::max, r.experts...);
  visit(Combine::max, r.shared...);
  visit(Combine::max, r.answers_wait...);
  visit(Combine::max, r.other...);
  visit(Combine::max, r.rows_wait_per_layer...);
  visit(Combine::max, r.answers_wait_per_layer...);
  visit(Combine::sum, r.bytes_sent...);
  visit(Combine::sum, r.saturated...);
  visit(Combine::sum, r.token_layers...);
  visit(Combine::sum, r.bytes_copied...);
  visit(Combine::sum, r.router...);
  visit(Combine::sum, r.tokens_per_layer...);
}

// One rank's block of the step's gather: its figures, its non-finite counts
// (their number, then two words each; none on a healthy step), then its
// traced tokens' records (their byte count, then the bytes).
std::vector<std::byte> encode_step_figures(const StepRecord& record);
// Reads one rank's block off the front of `blocks`: the figures (each
// per-layer list as long as `shape`'s: every rank serves the same layers),
// the non-finite counts and the traces. A block that does not parse is an
// internal error naming the step and the rank.
StepRecord decode_step_figures(std::span<const std::byte>& blocks, const StepRecord& shape, std::uint64_t step,
                               int rank);
// Rank 0's reduction of every rank's block (`all`, in rank order): `mine`
// with each figure maxed or summed over the ranks, the non-finite counts
// summed, the traces joined in rank order, and each rank's two waits per
// layer kept (rows_wait_by_rank, answers_wait_by_rank) before the max hides them.
StepRecord reduce_step_figures(const StepRecord& mine, std::span<const std::byte> all, int ranks, std::uint64_t step);

}  // namespace moed::runtime
