// Rank 0 joins a step's records into one trace per token and layer, keeps
// the last tokens in a bounded ring, and renders a token as JSON (what
// `moectl trace` prints and a dashboard draws as a timeline). Pure.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/layer_numbers.h"
#include "runtime/trace/trace_records.h"

namespace moed::runtime::trace {

struct LayerTrace {
  HomeRecord home;
  std::vector<ChoiceRecord> choices;  // the router's order
  std::vector<LegRecord> legs;        // by rank
  std::vector<VisitRecord> visits;    // by expert
};

struct TokenTrace {
  std::uint64_t request_id = 0;
  std::uint32_t position = 0;
  std::vector<LayerTrace> layers;  // by layer
};

// One LayerTrace per home record of `step`, with the records of the same
// TraceKey; records without a home record are dropped.
std::vector<LayerTrace> assemble(const TraceFragments& step);

// The last `capacity` traced tokens (request id, position), each with at most
// `layers` layers; a new token evicts the oldest one.
class TraceRing {
 public:
  TraceRing(std::size_t capacity, int layers) : capacity_(capacity), layers_(layers) {}
  // Into its token's entry; a layer served again replaces the older one.
  void add(LayerTrace layer);
  // The tokens of a request, oldest first.
  std::vector<TokenTrace> find(std::uint64_t request_id) const;
  std::size_t size() const { return tokens_.size(); }
  std::size_t capacity() const { return capacity_; }
  std::uint64_t evicted() const { return evicted_; }

 private:
  std::size_t capacity_;
  int layers_;
  std::deque<TokenTrace> tokens_;
  std::uint64_t evicted_ = 0;
};

// A token's trace. Per layer: step, epoch, home, experts with gate weights
// and the rank that ran each, ranks and islands visited, bytes moved, the
// phases on the home (route, plan, dispatch, wait, combine: they sum to
// total), the slowest expert's part of the wait, and spans for a timeline:
// {rank, phase, start_us, end_us} from the layer's sync point, with the
// layer's own start ("at_us") from the token's first traced layer.
// `model_layers`: the MoE layers a complete trace has; `numbers` names each
// layer by the model's own number.
nlohmann::json token_trace_json(const TokenTrace& token, int model_layers, const LayerNumbers& numbers = {});

}  // namespace moed::runtime::trace
