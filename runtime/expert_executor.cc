#include "runtime/expert_executor.h"

#include <cstring>

#include "kernels/cpu/expert_ffn.h"
#include "kernels/cpu/fixed_combine.h"

namespace moed::runtime {

std::size_t ExpertExecutor::run(const ExpertStore& store, int layer, const ReceivedRows& received,
                                const std::vector<ExpertBatch>& batches, std::vector<std::byte>& send,
                                comm::ExchangeLayout& layout) {
  const int H = store.shape().hidden;
  // Lay out the answers: row r of source s at row_offset_[s][r].
  layout.send_bytes = combine_message_bytes(received, H);
  layout.send_offsets = comm::ExchangeLayout::prefix_offsets(layout.send_bytes);
  send.resize(layout.send_total());
  row_offset_.resize(received.from.size());
  for (std::size_t s = 0; s < received.from.size(); ++s) {
    const auto& src = received.from[s];
    row_offset_[s].resize(src.rows);
    std::size_t at = layout.send_offsets[s];
    for (std::uint32_t r = 0; r < src.rows; ++r) {
      row_offset_[s][r] = at;
      std::size_t bytes = combine_row_bytes(src.pairs_per_row[r], H);
      if (src.pairs_per_row[r] > 1) std::memset(send.data() + at, 0, bytes);  // sums start at 0
      at += bytes;
    }
  }

  std::size_t saturated = 0;
  last_chunks_.clear();
  for (const ExpertBatch& batch : batches) {
    const kernels::ExpertView expert = store.expert(layer, batch.expert);
    std::size_t first = 0;
    for (std::uint32_t m : batch.chunk_rows) {
      last_chunks_.push_back(m);
      x_.resize(std::size_t(m) * H);
      y_.resize(std::size_t(m) * H);
      scratch_.resize(kernels::expert_ffn_scratch(expert, m));
      for (std::uint32_t i = 0; i < m; ++i) {
        const auto& row = batch.rows[first + i];
        std::memcpy(x_.data() + std::size_t(i) * H,
                    received.from[row.source].data + std::size_t(row.row) * H, H * sizeof(float));
      }
      kernels::expert_ffn(expert, x_.data(), m, y_.data(), scratch_.data());
      for (std::uint32_t i = 0; i < m; ++i) {
        const auto& row = batch.rows[first + i];
        const auto& src = received.from[row.source];
        std::byte* out = send.data() + row_offset_[row.source][row.row];
        const float* y = y_.data() + std::size_t(i) * H;
        if (src.pairs_per_row[row.row] == 1)
          std::memcpy(out, y, H * sizeof(float));
        else
          saturated += kernels::add_weighted_fixed(reinterpret_cast<std::int64_t*>(out), y,
                                                   src.weights[row.pair], H);
      }
      first += m;
    }
  }
  return saturated;
}

}  // namespace moed::runtime
