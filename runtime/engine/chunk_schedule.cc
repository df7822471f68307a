#include "runtime/engine/chunk_schedule.h"

#include <algorithm>

namespace moed::runtime {

ChunkSchedule schedule_chunks(const PlanInput& in, bool split_by_home) {
  const ExpertCounts& counts = *in.counts;
  const int R = counts.ranks();
  ChunkSchedule s;
  s.experts = in.placement->experts_on(in.layer, in.rank);
  s.rows_from.assign(s.experts.size(), std::vector<std::uint32_t>(std::size_t(R), 0));
  std::vector<std::uint64_t> start(std::size_t(R) + 1);  // home h: positions [start[h], start[h + 1])
  for (std::size_t slot = 0; slot < s.experts.size(); ++slot) {
    const int e = s.experts[slot];
    // Each chunk goes to one copy; every shard of that copy computes it.
    const std::size_t mine = std::size_t(in.placement->copy_on(in.layer, e, in.rank));
    const bool one_copy = in.placement->copies(in.layer, e) == 1;
    for (int h = 0; h < R; ++h) start[h + 1] = start[h] + counts.at(h, e);
    const std::uint64_t total = start[R], C = expert_chunk_rows(in, e);
    std::vector<std::uint32_t>& taken = s.rows_from[slot];  // rows of each home in earlier tasks
    for (std::uint64_t j = 0; j * C < total; ++j) {
      if (!one_copy && chunk_replica(in, e, j) != mine) continue;
      const std::uint64_t lo = j * C, hi = std::min(total, lo + C);
      ExpertTask task{int(slot), 0, {}};
      for (int h = 0; h < R; ++h) {
        const std::uint64_t a = std::max(lo, start[h]), b = std::min(hi, start[h + 1]);
        if (a >= b) continue;
        const TaskSegment seg{h, taken[h], std::uint32_t(b - a)};
        taken[h] += seg.rows;
        if (split_by_home) {
          s.tasks.push_back({int(slot), seg.rows, {seg}});
        } else {
          task.segments.push_back(seg);
          task.rows += seg.rows;
        }
      }
      if (!split_by_home) s.tasks.push_back(std::move(task));
    }
  }
  return s;
}

}  // namespace moed::runtime
