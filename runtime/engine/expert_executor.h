// The expert side of a layer: rows of one local expert run through the
// SwiGLU FFN in one call, and each output is written where its answer goes
// (see dispatch_plan.h for the combine format): copied as fp32 when its row
// carried one pair and experts have one canonical F-chunk, else added
// gate-weighted onto the row's fixed-point sum, chunk by chunk
// (kernels/cpu/expert_ffn.h).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "kernels/cpu/expert_ffn.h"

namespace moed::runtime {

// What an expert call counted.
struct ExpertCallCounts {
  std::size_t saturated = 0;  // fixed-point terms clamped (kernels/cpu/fixed_combine.h)
  // Terms (output element x gate weight) that are NaN or inf, wherever the
  // weighting happens: those elements of their tokens' outputs become NaN.
  std::size_t nonfinite = 0;

  ExpertCallCounts& operator+=(const ExpertCallCounts& o) {
    saturated += o.saturated;
    nonfinite += o.nonfinite;
    return *this;
  }
};

// One row of expert work: its input, and where its answer goes.
struct ExpertRow {
  const float* in = nullptr;   // hidden floats
  std::byte* out = nullptr;    // the row's answer in a combine message
  float weight = 0;            // the pair's gate weight (sums only)
  bool single = false;         // one pair, one chunk: out is fp32, unweighted
};

class ExpertExecutor {
 public:
  // Rows per FFN call: a longer call is cut into blocks of this many, with
  // `between_blocks` run between them, so that messages keep moving while
  // the experts compute (a rendezvous transfer advances only when its
  // sender polls). The cut is fixed, so it changes no bits.
  explicit ExpertExecutor(std::size_t block_rows = 256) : block_rows_(block_rows) {}

  // Runs `rows` through `expert`; counts the saturated and the non-finite terms.
  ExpertCallCounts run(const kernels::ExpertView& expert, std::span<const ExpertRow> rows,
                       const std::function<void()>& between_blocks = {});

  // Rows per GEMM call since the last clear (for the benchmark's bound), and
  // the bytes copied: rows gathered into the GEMM's input, fp32 answers out.
  const std::vector<std::uint32_t>& calls() const { return calls_; }
  std::uint64_t bytes_copied() const { return bytes_copied_; }
  void clear_counts() {
    calls_.clear();
    bytes_copied_ = 0;
  }

 private:
  ExpertCallCounts run_block(const kernels::ExpertView& expert, std::span<const ExpertRow> rows);

  std::size_t block_rows_;
  std::vector<float> x_, y_, scratch_;  // one call's rows, outputs and FFN scratch
  std::vector<std::uint32_t> calls_;
  std::uint64_t bytes_copied_ = 0;
};

}  // namespace moed::runtime
