#include "runtime/expert_executor.h"

#include <algorithm>
#include <cstring>

#include "kernels/cpu/fixed_combine.h"

namespace moed::runtime {

std::size_t ExpertExecutor::run(const kernels::ExpertView& expert, std::span<const ExpertRow> rows,
                                const std::function<void()>& between_blocks) {
  std::size_t saturated = 0;
  for (std::size_t first = 0; first < rows.size(); first += block_rows_) {
    if (first > 0 && between_blocks) between_blocks();
    saturated += run_block(expert, rows.subspan(first, std::min(block_rows_, rows.size() - first)));
  }
  return saturated;
}

std::size_t ExpertExecutor::run_block(const kernels::ExpertView& expert, std::span<const ExpertRow> rows) {
  const std::size_t H = expert.hidden, m = rows.size(), row_bytes = H * sizeof(float);
  if (m == 0) return 0;
  calls_.push_back(std::uint32_t(m));
  x_.resize(m * H);
  y_.resize(m * H);
  scratch_.resize(kernels::expert_ffn_scratch(expert, m));
  for (std::size_t i = 0; i < m; ++i) std::memcpy(x_.data() + i * H, rows[i].in, row_bytes);
  bytes_copied_ += m * row_bytes;
  kernels::expert_ffn(expert, x_.data(), m, y_.data(), scratch_.data());
  std::size_t saturated = 0;
  for (std::size_t i = 0; i < m; ++i) {
    const float* y = y_.data() + i * H;
    if (rows[i].single) {
      std::memcpy(rows[i].out, y, row_bytes);
      bytes_copied_ += row_bytes;
    } else {
      saturated += kernels::add_weighted_fixed(reinterpret_cast<std::int64_t*>(rows[i].out), y, rows[i].weight, H);
    }
  }
  return saturated;
}

}  // namespace moed::runtime
