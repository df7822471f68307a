// The expert side of a layer: the received rows of each local expert run
// through the SwiGLU FFN chunk by chunk, and the combine messages are written
// (one answer per received row: see dispatch_plan.h for the format).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "comm/transport.h"
#include "runtime/dispatch_plan.h"
#include "runtime/weights/expert_store.h"

namespace moed::runtime {

class ExpertExecutor {
 public:
  // Runs every chunk and fills `send` and the send half of `layout`.
  // Returns the count of saturated fixed-point terms.
  std::size_t run(const ExpertStore& store, int layer, const ReceivedRows& received,
                  const std::vector<ExpertBatch>& batches, std::vector<std::byte>& send,
                  comm::ExchangeLayout& layout);

  // Rows per GEMM call issued by the last run (for the benchmark's bound).
  const std::vector<std::uint32_t>& last_chunk_rows() const { return last_chunks_; }

 private:
  std::vector<float> x_, y_, scratch_;  // one chunk's rows, outputs and FFN scratch
  std::vector<std::vector<std::size_t>> row_offset_;  // [source][row] -> byte offset in send
  std::vector<std::uint32_t> last_chunks_;
};

}  // namespace moed::runtime
