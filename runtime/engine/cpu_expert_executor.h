// The experts on this rank's cores: each block of rows through the
// fixed-order kernels (kernels/cpu/expert_ffn.h), chunk by chunk, around the
// row-block logic every executor shares (row_block_executor.h).
#pragma once

#include <cstddef>
#include <vector>

#include "runtime/engine/row_block_executor.h"

namespace moed::runtime {

class CpuExpertExecutor final : public RowBlockExecutor {
 public:
  explicit CpuExpertExecutor(std::size_t block_rows = 256) : RowBlockExecutor(block_rows) {}
  ExpertDevice device() const override { return ExpertDevice::cpu; }

 private:
  void up(const kernels::ExpertView& expert, const float* x, std::size_t m) override;
  const float* down_chunk(const kernels::ExpertView& expert, std::size_t m, std::size_t chunk) override;

  std::vector<float> h13_, y_;  // the up-projection's output [m, 2F] and one chunk's [m, H]
};

}  // namespace moed::runtime
