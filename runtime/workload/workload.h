// Workloads: the tokens a daemon serves without an external client. A token
// is a pure function of its global id, so every rank count sees the same
// tokens, and a replayed trace can also fix each token's routing.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "runtime/config/config.h"
#include "runtime/router/router.h"

namespace moed::runtime {

class Workload {
 public:
  virtual ~Workload() = default;
  // Hidden states of global tokens [first, first + count), rows of `hidden` floats.
  virtual void tokens(std::uint64_t first, std::size_t count, float* hidden) const = 0;
  // True when routing comes from the workload (a trace) instead of the router.
  virtual bool replays_routing() const { return false; }
  // Appends the replayed routing of tokens [first, first + count) in `layer`.
  virtual void routing(std::uint64_t first, std::size_t count, int layer, Routing& out) const {}
  virtual std::string describe() const = 0;
};

// The workload named by [workload].kind; none for "ingress", whose tokens
// come through the front door. `gate0` is layer 0's gate matrix
// [experts, hidden], from which the synthetic workload aims its tokens.
std::unique_ptr<Workload> make_workload(const Config& config, const float* gate0);

}  // namespace moed::runtime
