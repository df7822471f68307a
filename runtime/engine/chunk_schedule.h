// Which expert rows this rank computes in one layer, worked out from the
// all-gathered counts before any row arrives, so that experts can start on
// the rows of the ranks whose messages are in while the rest still travel.
//
// An expert's rows of a layer are its positions in global token order (rule 1
// of dispatch_plan.h); home rank h holds positions [before(h), before(h) +
// at(h)), and its rows reach this rank in one message, in that order. So the
// k-th row this rank receives for expert e from home h is the k-th of h's
// positions that fall in this rank's chunks of e: a task (a chunk, or the part
// of a chunk from one home) names its rows as ranges of those arrivals.
//
// A shard of a split expert computes every chunk of the expert (its part of
// F), as an expert with one slot does.
//
// Pure: no MPI, no threads, unit-tested.
#pragma once

#include <cstdint>
#include <vector>

#include "runtime/engine/dispatch_plan.h"

namespace moed::runtime {

// Rows [first, first + rows) of what home `home` sends this rank for the
// task's expert.
struct TaskSegment {
  int home = 0;
  std::uint32_t first = 0, rows = 0;
};

// One unit of expert work: rows of one local expert, computed together.
struct ExpertTask {
  int slot = 0;          // index into ChunkSchedule::experts
  std::uint32_t rows = 0;
  std::vector<TaskSegment> segments;  // in position order
};

struct ChunkSchedule {
  std::vector<int> experts;  // this rank's experts of the layer, by slot
  // Tasks in (slot, position) order.
  std::vector<ExpertTask> tasks;
  // rows_from[slot][home]: rows of that expert this rank receives from that home.
  std::vector<std::vector<std::uint32_t>> rows_from;
};

// Whole chunks (split_by_home = false: a row's bits may depend on the rows
// it shares a GEMM call with, as with OpenBLAS) or chunks cut further at home
// boundaries (true: any rows may share a call, and a task is ready as soon
// as its one home's message is in).
ChunkSchedule schedule_chunks(const PlanInput& in, bool split_by_home);

}  // namespace moed::runtime
