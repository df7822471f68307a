#include "runtime/workload/trace_workload.h"

#include "common/error.h"
#include "common/rng.h"

namespace moed::runtime {

TraceWorkload::TraceWorkload(const Config& c)
    : hidden_(int(c.model.hidden)),
      seed_(std::uint64_t(c.workload.seed)),
      path_(c.workload.trace),
      trace_(routing::read_trace(c.workload.trace)) {
  if (trace_.tokens() == 0) MOED_THROW(Input, "{}: the trace holds no tokens", path_);
  if (trace_.layers() < c.model.layers)
    MOED_THROW(Input, "{}: the trace has {} layers, [model].layers = {} needs at least as many",
               path_, trace_.layers(), c.model.layers);
  for (std::size_t t = 0; t < trace_.tokens(); ++t)
    for (int l = 0; l < c.model.layers; ++l)
      for (const auto& choice : trace_.at(t, l))
        if (choice.expert >= std::uint64_t(c.model.experts))
          MOED_THROW(Input, "{}: token {} layer {} routes to expert {}, but [model].experts = {}",
                     path_, t, l, choice.expert, c.model.experts);
}

void TraceWorkload::tokens(std::uint64_t first, std::size_t count, float* hidden) const {
  for (std::size_t t = 0; t < count; ++t) {
    CounterRng rng(hash_combine(seed_, first + t));
    for (int i = 0; i < hidden_; ++i) hidden[t * hidden_ + i] = rng.normalish(i);
  }
}

void TraceWorkload::routing(std::uint64_t first, std::size_t count, int layer, Routing& out) const {
  for (std::size_t t = 0; t < count; ++t) {
    for (const auto& choice : trace_.at((first + t) % trace_.tokens(), layer)) out.add(choice.expert, choice.weight);
    out.end_token();
  }
}

std::string TraceWorkload::describe() const {
  return fmt::format("trace replay of {} ({} tokens, {} layers, top-{})", path_, trace_.tokens(),
                     trace_.layers(), trace_.top_k());
}

}  // namespace moed::runtime
