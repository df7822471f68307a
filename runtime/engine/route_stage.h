// The route stage of a layer on one rank (RouteStage): RMSNorm of the rows,
// then their experts, chosen by the router (the gate's logits from the
// fixed-order GEMM, then top-k or top-p) with the router policies: the
// balancing bias, the jitter measurement, the plain selection the balancing
// is counted against, and the exchange of every rank's candidates when a
// load policy decides for the whole job. It owns the buffers all that reuses
// from layer to layer.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "comm/transport.h"
#include "kernels/cpu/fixed_order_gemm.h"
#include "placement/placement.h"
#include "runtime/config/config.h"
#include "runtime/engine/expert_executor.h"
#include "runtime/engine/step_record.h"
#include "runtime/router/policies/router_policies.h"
#include "runtime/router/router.h"
#include "runtime/weights/expert_store.h"

namespace moed::runtime {

// The route stage on another device, with the CPU's bits (cuda_router.h):
// RMSNorm, gate and router there, the normalised rows and the routing back
// on the host; or, where a router policy decides on the host, RMSNorm and
// gate there, the normalised rows and the logits back.
class DeviceRouter {
 public:
  virtual ~DeviceRouter() = default;
  // x [count, hidden] of `layer` -> xn [count, hidden], and one routing row per token appended.
  // With `adjust` ([count, experts], host, or null): the router policies'
  // selection adjustments, as rank_experts takes them (then choose).
  virtual void route(int layer, const float* x, std::size_t count, float* xn, Routing& routing,
                     const double* adjust) = 0;
  // x [count, hidden] of `layer` -> xn [count, hidden] and logits
  // [count, experts]: the gate's, plus the layer's router bias if it has one.
  virtual void norm_and_gate(int layer, const float* x, std::size_t count, float* xn, float* logits) = 0;
};

// Whether a device router can choose the experts too under these policies:
// none needs the step's tokens on every rank (smoothing, a load policy) or
// the logits on the host (the jitter measurement). The balancing bias can.
// Where it cannot, the device normalises and gates, and the policies choose
// on the host.
bool device_can_route(const RouterPolicies& policies);

// The device router for experts on `device`, on CUDA device `gpu`: null on
// the CPU.
std::unique_ptr<DeviceRouter> make_device_router(ExpertDevice device, const Config& config, const ExpertStore& store,
                                                 int gpu);

class RouteStage {
 public:
  // `device_router` (may be null) routes where device_can_route, unless replayed.
  RouteStage(const Config& config, comm::Transport& transport, const placement::Placement& placement,
             const ExpertStore& store, std::unique_ptr<DeviceRouter> device_router = nullptr);

  // One layer's rows on this rank: x [count, hidden]; tags: their requests;
  // rows_of_rank: every rank's row count (the policies' exchange); where:
  // the layer, for errors.
  struct Rows {
    int layer = 0;
    const float* x = nullptr;
    std::size_t count = 0;
    std::span<const TokenTag> tags;
    std::span<const std::uint32_t> rows_of_rank;
    const std::string* where = nullptr;
  };
  // Normalises the rows (into normalised()) and picks their experts into
  // `routing`. `replayed`: routing already holds the workload's choice, on
  // which only a load policy acts. Collective when a policy shares tokens.
  void run(const Rows& rows, bool replayed, Routing& routing, StepRecord& rec);
  // The rows run() normalised, [count, hidden]: what the experts take.
  const float* normalised() const { return xn_.data(); }

  RouterPolicies& policies() { return policies_; }
  const RouterPolicies& policies() const { return policies_; }

 private:
  // logits[count, experts] of normalised rows xn: W_g x, plus the layer's
  // router bias when the family has one.
  void gate_logits(int layer, const float* xn, std::size_t count, float* logits) const;
  // The router with `layer`'s selection bias (DeepSeek's), if it has one.
  RouterParams router_of(int layer) const;
  // xn and logits of `count` rows x [count, hidden]: on the device router
  // where there is one, else here.
  void norm_and_gate(int layer, const float* x, std::size_t count, float* xn, float* logits);
  // The router's choice (no replay) from logits_, with the policies; false
  // when the router chose alone (no policy adjusts or decides).
  bool choose_experts(const Rows& rows, Routing& routing, StepRecord& rec);
  // The jitter measurement: the rows' choices again under relative noise.
  void measure_jitter(const Rows& rows, const double* adjust, StepRecord& rec);
  // The router's own selection of the rows (no bias, no load policy) into
  // plain_routing_, to count the pairs the balancing policies change.
  void plain_selection(const Rows& rows);
  // Every rank's candidates (ranked_), then the policies' one decision.
  void share_and_decide(const Rows& rows, Routing& routing, StepRecord& rec);

  const Config& config_;
  comm::Transport& transport_;
  const placement::Placement& placement_;
  const ExpertStore& store_;
  RouterParams router_;
  std::vector<kernels::PackedWeights> gate_;  // per layer: the gate [experts, hidden], packed
  RouterPolicies policies_;
  std::unique_ptr<DeviceRouter> device_router_;

  // Buffers reused from layer to layer.
  std::vector<float> xn_, logits_;
  std::vector<double> adjust_, plain_adjust_;
  Ranked ranked_, noisy_ranked_, all_ranked_, plain_ranked_;
  Routing plain_routing_;
  std::vector<TokenTag> all_tags_;
  std::vector<std::uint32_t> records_, all_records_, replicas_;
  std::vector<float> noisy_, noisy_xn_, noisy_logits_;
  std::vector<std::uint64_t> jitter_keys_;
};

}  // namespace moed::runtime
