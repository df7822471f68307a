// Routing statistics, the input of placement: per MoE layer, how many tokens
// each expert took (load), how often two experts were chosen for the same
// token (co-activation), and how often a token went from expert a in layer l
// to expert b in layer l+1 (affinity). Counts decay exponentially with a
// half-life in steps, so the statistics follow shifting traffic. Beside the
// aggregates, a bounded sample of recent tokens' full paths is kept, on which
// the cost model evaluates placements exactly.
//
// Memory is bounded by the shape, not by traffic: 8 bytes x (L*E + L*E*(E-1)/2
// + (L-1)*E*E + L) for the aggregates plus the sample (4 bytes x L x (max_k + 1)
// per token). DeepSeek-V3 (58 layers x 256 experts): 5,643,578 doubles = 45.1 MB,
// plus 8.6 MB for a sample of 4096 top-8 tokens. Writing a stats file builds it
// in memory first (the same size again, for the moment of the write).
//
// Decay: values are stored raw, each observation weighted by the weight of
// "now" (2^(steps / half_life)); accessors divide by it. The stored values are
// brought back to weight 1 whenever that weight passes 2^64, so nothing
// overflows however long the daemon runs.
//
// Pure: no MPI, no threads; not thread-safe, not even for concurrent const
// calls (sample_cells() puts the ring in order in place). The daemon merges
// ranks' statistics by summing raw() after normalize(); every rank has taken
// the same number of steps.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "routing/routing_trace.h"

namespace moed::routing {

class RoutingStats {
 public:
  // half_life_steps = 0: no decay (plain counts). sample_tokens: capacity of
  // the path sample (0: no sample); max_k: most experts per token per layer.
  RoutingStats(int layers, int experts, double half_life_steps, std::size_t sample_tokens = 0,
               int max_k = 8);

  int layers() const { return layers_; }
  int experts() const { return experts_; }
  double half_life_steps() const { return half_life_; }
  std::uint64_t steps() const { return steps_; }

  // One token's experts in `layer`: load and co-activation (every pair once).
  void add_choice(int layer, std::span<const std::uint32_t> experts);
  // One token's experts in `layer` and in `layer + 1`: affinity for every pair.
  void add_transition(int layer, std::span<const std::uint32_t> from,
                      std::span<const std::uint32_t> to);
  // One token's whole path (experts per layer) into the sample; the oldest
  // path leaves when the sample is full.
  void add_sample(const std::vector<std::span<const std::uint32_t>>& path);
  // Ends a step: earlier counts weigh 2^(-1 / half_life) as much from now on.
  void end_step();
  // A path with more than max_k experts in a cell, an expert out of range or
  // twice in one list, or a layer out of range is an Internal error (the
  // router never produces one); a refused call changes nothing.

  // Decayed values as of now.
  double load(int layer, int expert) const;
  double coactivation(int layer, int a, int b) const;  // symmetric; 0 when a == b
  double affinity(int layer, int a, int b) const;      // a in layer, b in layer + 1
  // Decayed tokens seen in a layer (sum of loads / experts per token is not
  // this: top-p varies k).
  double tokens(int layer) const;

  // The sample as a trace (oldest first; gate weights are not kept: 1/k each).
  RoutingTrace sample_trace() const;
  std::size_t sample_size() const;

  // Merging ranks: bring the stored values to weight 1 (exactly what the
  // accessors return), then the raw arrays of equal shapes add up.
  void normalize();
  std::vector<double>& raw() { return values_; }
  const std::vector<double>& raw() const { return values_; }
  // The length of raw() for a shape, and which statistic raw()[i] is (for messages).
  static std::size_t value_count(std::size_t layers, std::size_t experts);
  std::string describe_value(std::size_t i) const;
  // Appends another rank's sample paths (for rank 0 after a gather).
  void append_sample(const RoutingStats& other);
  // The sample's storage, for gathering: sample_size() paths, oldest first;
  // per path, per layer a cell of max_k + 1 u32 (count, experts..., zeros).
  const std::vector<std::uint32_t>& sample_cells() const {
    order_sample();
    return sample_;
  }
  // Appends paths in that layout (the same layers and max_k), oldest first.
  void append_sample_cells(std::span<const std::uint32_t> cells);

  // The router's online balancing biases, [layer * experts + e], kept with
  // the statistics so that a restart resumes them (empty: none). Not merged
  // across ranks: every rank holds the same.
  const std::vector<double>& router_bias() const { return router_bias_; }
  void set_router_bias(std::vector<double> bias);

  // Builds statistics from tokens [first, first + count) of a trace, no decay,
  // with every one of those tokens in the sample (capacity count, max_k the
  // trace's top_k). Cells without routing add nothing; a transition is counted
  // where both consecutive cells have routing.
  static RoutingStats from_trace(const RoutingTrace& trace, std::size_t first, std::size_t count);

 private:
  // The stats file (routing/stats_file.h) saves and restores the raw state.
  friend RoutingStats read_stats_file(const std::string& path);
  friend void write_stats_file(const RoutingStats& stats, const std::string& path);

  std::size_t load_index(int layer, int e) const;
  std::size_t coact_index(int layer, int a, int b) const;
  std::size_t affinity_index(int layer, int a, int b) const;
  std::size_t tokens_index(int layer) const;
  void check_experts(int layer, std::span<const std::uint32_t> experts) const;
  // Validates paths of `width` u32 per cell (the count, then experts) before
  // anything is appended, so that a refused call leaves the sample unchanged.
  void check_paths(std::span<const std::uint32_t> cells, std::size_t width) const;
  void append_paths(std::span<const std::uint32_t> cells, std::size_t width);
  std::uint32_t* next_sample_slot();  // the path to overwrite (or a new one)
  void order_sample() const;          // rotates the ring so that the oldest path is first

  int layers_, experts_, max_k_;
  double half_life_;
  std::uint64_t steps_ = 0;
  std::uint64_t decay_steps_ = 0;  // steps since the stored values last had weight 1
  double weight_ = 1.0;  // weight of an observation made now; values are raw / weight_
  std::vector<double> values_;   // loads, then co-activation triangles, then affinity squares, then tokens per layer
  std::size_t coact_base_ = 0, affinity_base_ = 0, tokens_base_ = 0;  // offsets in values_
  std::size_t path_size_ = 0;  // u32 per sampled path: layers x (max_k + 1)
  std::size_t sample_capacity_;
  // Ring of sample_count_ paths; once full, sample_next_ is the oldest (the
  // next to be overwritten). Mutable: sample_cells() rotates it into order.
  mutable std::vector<std::uint32_t> sample_;
  mutable std::size_t sample_next_ = 0;
  std::size_t sample_count_ = 0;
  std::vector<double> router_bias_;
};

}  // namespace moed::routing
