// Helpers shared by the tests of a layer's pure data path (test_dispatch_plan.cc,
// test_wire_format.cc, test_gateway.cc, test_chunk_schedule.cc and
// test_layer_in_memory.cc): routings and counts written by hand, recognisable
// token rows, batches packed and parsed as a rank receives them, a PlanInput,
// and a RowBatch checked field by field. Header only, in one test binary.
#pragma once

#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <utility>
#include <vector>

#include "placement/placement.h"
#include "runtime/engine/dispatch_plan.h"
#include "runtime/engine/wire_format.h"
#include "runtime/router/router.h"

namespace moed::runtime {

using Pairs = std::vector<std::pair<std::uint32_t, float>>;

inline Routing make_routing(const std::vector<Pairs>& tokens) {
  Routing r;
  for (const auto& t : tokens) {
    for (auto [e, w] : t) r.add(e, w);
    r.end_token();
  }
  return r;
}

inline ExpertCounts counts_of(const std::vector<std::vector<std::uint32_t>>& rows) {
  ExpertCounts c(int(rows.size()), int(rows.front().size()));
  for (std::size_t r = 0; r < rows.size(); ++r)
    std::memcpy(c.data() + r * rows[r].size(), rows[r].data(), rows[r].size() * sizeof(std::uint32_t));
  return c;
}

// Rows of `tokens` tokens, element i of token t being 100 t + i: each row recognisable.
inline std::vector<float> token_rows(std::size_t tokens, int hidden) {
  std::vector<float> x(tokens * hidden);
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = float(100 * (i / hidden) + i % hidden);
  return x;
}

// Views `batches[s]`, packed, as the messages a rank received from rank s.
struct Received {
  std::vector<std::byte> buffer;
  comm::ExchangeLayout layout;
  ReceivedRows rows;
};
inline void receive(const std::vector<RowBatch>& batches, int hidden, Received& out) {
  pack_rows(batches, hidden, out.buffer, out.layout);
  out.layout.recv_bytes = out.layout.send_bytes;
  out.layout.recv_offsets = out.layout.send_offsets;
  out.rows = parse_rows(out.buffer.data(), out.layout, hidden);
}

inline PlanInput plan_input(const Routing& r, const placement::Placement& p, const ExpertCounts& c, int rank,
                            std::uint64_t chunk_rows = 1, std::uint64_t step = 0, int layer = 0) {
  return PlanInput{&r, &p, layer, &c, rank, chunk_rows, step};
}

// One RowBatch as expected. Rows of local tokens (origin >= 0) must point at their row of `x`.
struct Want {
  std::vector<std::uint64_t> token;
  std::vector<std::int64_t> origin;
  std::vector<std::uint32_t> pair_offsets;
  std::vector<std::uint32_t> experts;
  std::vector<float> weights;
  std::vector<std::uint32_t> dests;
};

inline void expect_batch(const RowBatch& b, const Want& want, const float* x = nullptr, int hidden = 0) {
  EXPECT_EQ(b.token, want.token);
  EXPECT_EQ(b.origin, want.origin);
  EXPECT_EQ(b.pair_offsets, want.pair_offsets);
  EXPECT_EQ(b.experts, want.experts);
  EXPECT_EQ(b.weights, want.weights);
  EXPECT_EQ(b.dests, want.dests);
  ASSERT_EQ(b.data.size(), b.rows());
  if (x)
    for (std::size_t r = 0; r < b.rows(); ++r)
      if (b.origin[r] >= 0) {
        EXPECT_EQ(b.data[r], x + b.origin[r] * hidden) << "row " << r;
      }
}

inline void expect_empty(const std::vector<RowBatch>& batches) {
  for (std::size_t d = 0; d < batches.size(); ++d) EXPECT_EQ(batches[d].rows(), 0u) << "to rank " << d;
}

}  // namespace moed::runtime
