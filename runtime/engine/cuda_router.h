// The route stage on the rank's GPU (built where the CUDA kernels are):
// RMSNorm, the fp32 gate, gpt-oss's router bias and the router (every
// family's: kernels/cuda's route_tokens, with the balancing bias's
// adjustments when the stage hands them over), with the CPU's bits at each
// step: kernels/cuda's rms_norm sums as kernels::rms_norm does, the gate is
// the fixed-order GEMM over fp32 weights, and the router shares the CPU
// router's arithmetic. The normalised rows (what the experts take) and the
// routing come back to the host, where dispatch goes on unchanged; under a
// policy that decides on the host, the normalised rows and the logits. Each
// layer's norm, gate and biases are copied to the device at construction:
// they never migrate.
#pragma once

#include <memory>

#include "runtime/engine/route_stage.h"

namespace moed::runtime {

class CudaRouter final : public DeviceRouter {
 public:
  // On CUDA device `gpu`; a CUDA error names the call.
  CudaRouter(const Config& config, const ExpertStore& store, int gpu);
  ~CudaRouter() override;

  void route(int layer, const float* x, std::size_t count, float* xn, Routing& routing,
             const double* adjust) override;
  void norm_and_gate(int layer, const float* x, std::size_t count, float* xn, float* logits) override;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace moed::runtime
