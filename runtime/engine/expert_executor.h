// The seam between the step loop and what runs the experts: a layer pass
// hands an executor one local expert and its rows (each row's input, and
// where its answer goes in a combine message: see dispatch_plan.h), and the
// executor writes every answer. CpuExpertExecutor (cpu_expert_executor.h)
// runs them on this rank's cores, CudaExpertExecutor (cuda_expert_executor.h)
// on its GPU, both around the same host logic (row_block_executor.h).
// make_expert_executor picks one by ExpertDevice (expert_device.h says which
// device a rank gets).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string_view>
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

// Where experts run.
enum class ExpertDevice { cpu, cuda };
std::string_view to_string(ExpertDevice device);

class ExpertExecutor {
 public:
  virtual ~ExpertExecutor() = default;
  virtual ExpertDevice device() const = 0;

  // Runs `rows` through `expert` and writes each row's answer: copied as
  // fp32 when the row is `single` (one pair, an expert of one F-chunk),
  // else added gate-weighted onto the row's fixed-point sum, chunk by chunk,
  // so that the shards of a split expert add up to the same integers.
  // `between_blocks` runs between the row blocks a long call is cut into, so
  // that messages keep moving while the experts compute (a rendezvous
  // transfer advances only when its sender polls); the cut changes no bits.
  // Counts the saturated and the non-finite terms.
  ExpertCallCounts run(const kernels::ExpertView& expert, std::span<const ExpertRow> rows,
                       const std::function<void()>& between_blocks = {}) {
    return run_rows(expert, rows, between_blocks);
  }

  // A step begins: an executor that keeps copies of weights (a GPU's) lets
  // go of those no step has used for a while, so that nothing grows with
  // the slots a rank has held over its life.
  virtual void begin_step() {}

  // Rows per FFN call since the last clear (for the benchmark's bound), and
  // the bytes copied: rows gathered into the FFN's input, fp32 answers out.
  virtual const std::vector<std::uint32_t>& calls() const = 0;
  virtual std::uint64_t bytes_copied() const = 0;
  virtual void clear_counts() = 0;

 private:
  virtual ExpertCallCounts run_rows(const kernels::ExpertView& expert, std::span<const ExpertRow> rows,
                                    const std::function<void()>& between_blocks) = 0;
};

// The executor of `device` (on CUDA device `gpu`), cutting calls into blocks
// of `block_rows` rows. A Usage error for a device this build cannot run
// experts on.
std::unique_ptr<ExpertExecutor> make_expert_executor(ExpertDevice device, std::size_t block_rows = 256, int gpu = 0);

}  // namespace moed::runtime
