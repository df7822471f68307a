// The experts on this rank's cores: rows of one local expert gathered and run
// through its FFN in one call of the fixed-order kernels (kernels/cpu/expert_ffn.h),
// chunk by chunk, each output weighted onto its row's fixed-point sum
// (kernels/cpu/fixed_combine.h) or copied out as fp32.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "runtime/engine/expert_executor.h"

namespace moed::runtime {

class CpuExpertExecutor final : public ExpertExecutor {
 public:
  // Rows per FFN call: a longer call is cut into blocks of this many. The
  // cut is fixed, so it changes no bits.
  explicit CpuExpertExecutor(std::size_t block_rows = 256) : block_rows_(block_rows) {}

  ExpertDevice device() const override { return ExpertDevice::cpu; }
  const std::vector<std::uint32_t>& calls() const override { return calls_; }
  std::uint64_t bytes_copied() const override { return bytes_copied_; }
  void clear_counts() override {
    calls_.clear();
    bytes_copied_ = 0;
  }

 private:
  ExpertCallCounts run_rows(const kernels::ExpertView& expert, std::span<const ExpertRow> rows,
                            const std::function<void()>& between_blocks) override;
  ExpertCallCounts run_block(const kernels::ExpertView& expert, std::span<const ExpertRow> rows);

  std::size_t block_rows_;
  std::vector<float> x_, y_, scratch_;  // one call's rows, outputs and FFN scratch
  std::vector<std::uint32_t> calls_;
  std::uint64_t bytes_copied_ = 0;
};

}  // namespace moed::runtime
