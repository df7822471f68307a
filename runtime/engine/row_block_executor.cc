#include "runtime/engine/row_block_executor.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "common/error.h"
#include "kernels/cpu/finite_scan.h"
#include "kernels/cpu/fixed_combine.h"

namespace moed::runtime {

ExpertCallCounts RowBlockExecutor::run_rows(const kernels::ExpertView& expert, std::span<const ExpertRow> rows,
                                            const std::function<void()>& between_blocks) {
  ExpertCallCounts counts;
  for (std::size_t first = 0; first < rows.size(); first += block_rows_) {
    if (first > 0 && between_blocks) between_blocks();
    counts += run_block(expert, rows.subspan(first, std::min(block_rows_, rows.size() - first)));
  }
  return counts;
}

ExpertCallCounts RowBlockExecutor::run_block(const kernels::ExpertView& expert, std::span<const ExpertRow> rows) {
  const std::size_t H = expert.hidden, m = rows.size(), row_bytes = H * sizeof(float);
  if (m == 0) return {};
  calls_.push_back(std::uint32_t(m));
  float* x = at_least(x_, m * H);
  for (std::size_t i = 0; i < m; ++i) std::memcpy(x + i * H, rows[i].in, row_bytes);
  bytes_copied_ += m * row_bytes;
  // Chunk by chunk (kernels/cpu/expert_ffn.h): each chunk's output is
  // weighted onto its rows' fixed-point sums, so that the shards of a split
  // expert, which hold whole chunks, add up to the same integers.
  up(expert, x, m);
  ExpertCallCounts counts;
  for (std::size_t c = 0; c < expert.chunks; ++c) {
    const float* chunk = down_chunk(expert, m, c);
    for (std::size_t i = 0; i < m; ++i) {
      const float* y = chunk + i * H;
      // Counted here, where the expert is known, for rows weighted here and
      // rows whose fp32 output is weighted at the token's home alike (per
      // chunk: a shard counts the terms of its own chunks).
      counts.nonfinite += std::isfinite(rows[i].weight) ? kernels::count_nonfinite(y, H) : H;
      if (rows[i].single) {
        // An fp32 answer is one whole output: only an expert of one chunk gives it.
        MOED_CHECK(expert.chunks == 1, "an fp32 answer from an expert of {} chunks", expert.chunks);
        std::memcpy(rows[i].out, y, row_bytes);
        bytes_copied_ += row_bytes;
      } else {
        counts.saturated +=
            kernels::add_weighted_fixed(reinterpret_cast<std::int64_t*>(rows[i].out), y, rows[i].weight, H);
      }
    }
  }
  return counts;
}

}  // namespace moed::runtime
