#include "runtime/engine/cpu_expert_executor.h"

namespace moed::runtime {

void CpuExpertExecutor::up(const kernels::ExpertView& expert, const float* x, std::size_t m) {
  kernels::expert_ffn_up(expert, x, m, at_least(h13_, kernels::expert_ffn_scratch(expert, m)));
}

const float* CpuExpertExecutor::down_chunk(const kernels::ExpertView& expert, std::size_t m, std::size_t chunk) {
  float* y = at_least(y_, m * expert.hidden);
  kernels::expert_ffn_down_chunk(expert, h13_.data(), m, chunk, y);
  return y;
}

}  // namespace moed::runtime
