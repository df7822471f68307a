// The experts on the rank's GPU (built where the CUDA kernels are). Each
// expert's weights are copied to the device once, in their resident format
// and encoded_matrix.h's layout (the one a migrated slot travels in), the
// first time a step uses them; the fixed-order kernels (kernels/cuda's
// gemm_fixed_order) then run each block of rows, and the chunks' outputs come
// back to the host logic every executor shares (row_block_executor.h), which
// writes the answers with the CPU's combine. So a row's bits are the CPU's
// with fp32 products ([experts].products = f32), whatever its batch. With
// bf16 products (kernels::compact_products() when a block starts), compact
// experts' GEMMs run on the tensor cores instead (kernels/cuda's
// gemm_tensor_core): bits of their own, as independent of the batch.
//
// Copies are keyed by ExpertView::serial, so a slot made again (a migration)
// is copied again; one no step has used for more than kIdleSteps steps is
// let go (so for that long after a migration, its old copy is still held).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "runtime/engine/row_block_executor.h"

namespace moed::runtime {

class CudaExpertExecutor final : public RowBlockExecutor {
 public:
  static constexpr std::uint64_t kIdleSteps = 256;

  // On CUDA device `gpu` (cudaSetDevice): a CUDA error names the call.
  CudaExpertExecutor(int gpu, std::size_t block_rows = 256);
  ~CudaExpertExecutor() override;

  ExpertDevice device() const override { return ExpertDevice::cuda; }
  void begin_step() override;
  // Experts whose weights are on the device now.
  std::size_t experts_on_device() const;

 private:
  void up(const kernels::ExpertView& expert, const float* x, std::size_t m) override;
  const float* down_chunk(const kernels::ExpertView& expert, std::size_t m, std::size_t chunk) override;

  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace moed::runtime
