// What every executor does around the FFN, whatever runs it: rows cut into
// blocks (between_blocks runs between them), each block's inputs gathered,
// the FFN run chunk by chunk, and each chunk's output written where its rows'
// answers go (copied as fp32, or weighted onto fixed-point sums with
// kernels/cpu/fixed_combine.h), counting saturated and non-finite terms. So
// the combine's rule is one piece of host code for every device. A derived
// executor says where the up-projection and each chunk's down-projection run.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "runtime/engine/expert_executor.h"

namespace moed::runtime {

class RowBlockExecutor : public ExpertExecutor {
 public:
  // Rows per FFN call: a longer call is cut into blocks of this many. The
  // cut is fixed, so it changes no bits.
  explicit RowBlockExecutor(std::size_t block_rows) : block_rows_(block_rows) {}

  const std::vector<std::uint32_t>& calls() const override { return calls_; }
  std::uint64_t bytes_copied() const override { return bytes_copied_; }
  void clear_counts() override {
    calls_.clear();
    bytes_copied_ = 0;
  }

 protected:
  // The up-projection and activation of `m` gathered rows x [m, H] (host memory).
  virtual void up(const kernels::ExpertView& expert, const float* x, std::size_t m) = 0;
  // Chunk `chunk`'s down-projection of the rows up() last took: [m, H]
  // floats in host memory, valid until the next call.
  virtual const float* down_chunk(const kernels::ExpertView& expert, std::size_t m, std::size_t chunk) = 0;
  // `buffer` holding at least `floats`: grown, never shrunk (resizing up
  // again within the capacity would zero it at every call whose rows
  // outnumber the last one's).
  static float* at_least(std::vector<float>& buffer, std::size_t floats) {
    if (buffer.size() < floats) buffer.resize(floats);
    return buffer.data();
  }

 private:
  ExpertCallCounts run_rows(const kernels::ExpertView& expert, std::span<const ExpertRow> rows,
                            const std::function<void()>& between_blocks) final;
  ExpertCallCounts run_block(const kernels::ExpertView& expert, std::span<const ExpertRow> rows);

  std::size_t block_rows_;
  std::vector<float> x_;  // one block's rows, gathered
  std::vector<std::uint32_t> calls_;
  std::uint64_t bytes_copied_ = 0;
};

}  // namespace moed::runtime
