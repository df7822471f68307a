// Rank 0's traces: each step's records from every rank are joined into the
// ring (the step thread), and `moectl trace` reads it (the admin socket's
// thread). Bounded: [trace].ring tokens of at most [model].layers layers.
#pragma once

#include <cstdint>
#include <deque>
#include <mutex>

#include <nlohmann/json.hpp>

#include "runtime/trace/trace_assembly.h"
#include "runtime/trace/trace_records.h"

namespace moed::runtime::trace {

class Tracer {
 public:
  // `numbers`: the model's layer numbers, as the answers name layers.
  Tracer(std::size_t ring, int layers, double sample, LayerNumbers numbers = {})
      : ring_(ring, layers), layers_(layers), sample_(sample), numbers_(std::move(numbers)) {}

  // Every rank's records of one step (rank 0, after the step's figures).
  void absorb(const TraceFragments& step);
  // The answer to `trace` for a request id: its traced tokens, or an error
  // body (admin::error_body) that says why there is none.
  nlohmann::json answer(std::uint64_t request_id) const;
  // A request followed (moectl trace --follow) only after its last position
  // was served: a built-in workload knows the step of every request, so
  // `trace` then says at once that the follow came too late, instead of
  // moectl waiting for a token that will not come. The newest kLateKept are kept.
  void note_too_late(std::uint64_t request_id, std::uint64_t last_step, std::uint64_t follow_step);

 private:
  struct TooLate {
    std::uint64_t request_id, last_step, follow_step;
  };
  static constexpr std::size_t kLateKept = 64;

  mutable std::mutex mu_;
  TraceRing ring_;
  int layers_;
  double sample_;
  LayerNumbers numbers_;
  std::uint64_t tokens_seen_ = 0;  // token-layers absorbed
  std::deque<TooLate> too_late_;
};

}  // namespace moed::runtime::trace
