// What the ranks record of a traced token, as flat records that travel to
// rank 0 with each step's figures (runtime/engine/step_record.h,
// encode_step_figures), so that tracing adds no collective: a step with
// nothing traced sends one empty count. A token's life in one layer is
// spread over ranks: its home rank routes it and sums its answers
// (HomeRecord, ChoiceRecord, LegRecord), the ranks holding its experts
// compute (VisitRecord). Rank 0 joins them by TraceKey
// (runtime/trace/trace_assembly.h).
//
// Times are microseconds from the layer's sync point on the rank that
// recorded them: the moment the counts' all-gather returned, which every
// rank leaves at about the same time. So offsets from different ranks line
// up without synchronised clocks (to within that all-gather's skew).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace moed::runtime::trace {

// One token in one layer of one step: its home rank and its step-wide key
// (the key its rows carry on the wire).
struct TraceKey {
  std::uint64_t key = 0;
  std::int32_t home = 0, layer = 0;
  bool operator==(const TraceKey&) const = default;
};

struct HomeRecord {
  TraceKey at;
  std::uint64_t request_id = 0, step = 0, epoch = 0;
  std::uint32_t position = 0;
  std::int32_t island = 0;
  double sync_s = 0;      // the home's clock at the sync point (orders the layers of a token)
  float route_us = 0;     // norm and router of the home's rows; it ended gather_us before the sync point
  float gather_us = 0;    // the counts' all-gather (waiting for every rank's counts)
  float planned_us = 0;   // the plans were made (offset)
  float sent_us = 0;      // the rows had left (offset)
  float combined_us = 0;  // the layer's sums and residual were done on the home (offset)
};

struct ChoiceRecord {  // an expert the router chose, in the router's order
  TraceKey at;
  std::uint32_t expert = 0;
  float weight = 0;
};

struct LegRecord {  // the token's row to one rank (its own rank included: 0 bytes)
  TraceKey at;
  std::int32_t rank = 0, island = 0;
  std::uint32_t pairs = 0;           // experts of the token that row carries
  std::uint32_t via_gateway = 0;     // 1: to a gateway, which forwards it in its island
  std::uint64_t row_bytes = 0, answer_bytes = 0;
  float back_us = -1;                // the answer was back on the home (offset; -1: never seen)
};

struct VisitRecord {  // one of the token's experts, on the rank that ran it
  TraceKey at;
  std::int32_t rank = 0, island = 0;
  std::uint32_t expert = 0, call_rows = 0;  // rows of the expert call that held the token
  float arrived_us = 0, start_us = 0, end_us = 0, answered_us = -1;  // offsets on that rank
};

// One rank's records of one step (or, on rank 0, every rank's).
struct TraceFragments {
  std::vector<HomeRecord> homes;
  std::vector<ChoiceRecord> choices;
  std::vector<LegRecord> legs;
  std::vector<VisitRecord> visits;

  bool empty() const { return homes.empty() && choices.empty() && legs.empty() && visits.empty(); }
  void clear();
  void append(const TraceFragments& other);
};

// Bytes to send: four counts, then the records. Empty fragments encode as
// nothing (0 bytes).
std::vector<std::byte> encode_fragments(const TraceFragments& f);
// Appends what `bytes` holds to `out`; a malformed block is an internal
// error naming `what`.
void decode_fragments(const std::byte* bytes, std::size_t size, const char* what, TraceFragments& out);

}  // namespace moed::runtime::trace
