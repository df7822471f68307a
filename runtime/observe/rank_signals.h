// The three golden signals per rank, for the dashboard's health view and
// the moed_rank_* metrics (rank 0): the activation rate and the expert load
// spread of the tokens each rank routed, over the load window, and the
// recent p99 of each rank's own all-to-all waits (the job's figures take
// the max over ranks, which hides which rank waits).
//
// Memory is fixed by the shape: the window holds load_window_steps steps of
// ranks x layers x experts counts, the waits recent_steps x layers samples
// per rank and phase. Pure; not thread-safe.
#pragma once

#include <cstdint>
#include <vector>

#include "common/recent_samples.h"
#include "runtime/engine/step_record.h"

namespace moed::runtime {

struct RankFigures {
  double activation_rate = 0;     // experts per routed token over all experts, load window
  double load_std_over_mean = 0;  // of the rank's routed tokens over experts, per layer, mean over layers
  double alltoall_p99_ms = 0;     // recent p99 of the dispatch or the combine wait, the larger
  bool routed = false;            // the rank routed tokens in the load window (else the first two are 0)
};

class RankSignals {
 public:
  RankSignals(int ranks, int layers, int experts, int load_window_steps, int recent_steps);

  // One measured step's record (rank 0's). A record without per-rank figures
  // (the other ranks', or a test's) is ignored.
  void add_step(const StepRecord& rec);
  // One per rank; empty before the first step with per-rank figures.
  std::vector<RankFigures> figures() const;
  // The steps and waits held in the windows: at most their sizes.
  std::size_t retained_samples() const;

 private:
  int ranks_, layers_, experts_, window_;
  bool seen_ = false;
  // The last window_ steps' routed loads and rows (ring), and their sums.
  std::vector<std::vector<std::uint64_t>> load_ring_, rows_ring_;
  std::size_t next_ = 0;
  std::vector<std::uint64_t> load_sum_, rows_sum_;
  std::vector<RecentSamples> rows_wait_, answers_wait_;  // per rank, seconds
};

}  // namespace moed::runtime
