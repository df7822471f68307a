// Trace replay: each token's routing comes from a recorded trace (token id
// modulo the trace's tokens), its hidden state is synthetic noise. The expert
// computation, dispatch and combine run as usual, so a real model's routing
// can be served and measured without its weights or activations.
#pragma once

#include "routing/routing_trace.h"
#include "runtime/workload/workload.h"

namespace moed::runtime {

class TraceWorkload final : public Workload {
 public:
  // Reads [workload].trace and checks it against [model]: Input errors name the file.
  explicit TraceWorkload(const Config& config);
  void tokens(std::uint64_t first, std::size_t count, float* hidden) const override;
  bool replays_routing() const override { return true; }
  void routing(std::uint64_t first, std::size_t count, int layer, Routing& out) const override;
  std::string describe() const override;

 private:
  int hidden_;
  std::uint64_t seed_;
  std::string path_;
  routing::RoutingTrace trace_;
};

}  // namespace moed::runtime
