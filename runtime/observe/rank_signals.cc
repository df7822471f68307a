#include "runtime/observe/rank_signals.h"

#include <algorithm>

#include "common/error.h"
#include "common/summary_stats.h"

namespace moed::runtime {

RankSignals::RankSignals(int ranks, int layers, int experts, int load_window_steps, int recent_steps)
    : ranks_(ranks),
      layers_(layers),
      experts_(experts),
      window_(load_window_steps),
      load_sum_(std::size_t(ranks) * std::size_t(layers) * std::size_t(experts), 0),
      rows_sum_(std::size_t(ranks) * std::size_t(layers), 0) {
  MOED_CHECK(ranks > 0 && layers > 0 && experts > 0 && load_window_steps > 0 && recent_steps > 0,
             "rank signals of {} ranks, {} layers, {} experts, windows {} and {}", ranks, layers, experts,
             load_window_steps, recent_steps);
  for (int r = 0; r < ranks; ++r) {
    rows_wait_.emplace_back(std::size_t(recent_steps) * std::size_t(layers));
    answers_wait_.emplace_back(std::size_t(recent_steps) * std::size_t(layers));
  }
}

std::size_t RankSignals::retained_samples() const {
  std::size_t n = load_ring_.size() + rows_ring_.size();
  for (int r = 0; r < ranks_; ++r) n += rows_wait_[std::size_t(r)].size() + answers_wait_[std::size_t(r)].size();
  return n;
}

void RankSignals::add_step(const StepRecord& rec) {
  if (rec.routed_rows_by_rank.empty()) return;
  MOED_CHECK(rec.routed_rows_by_rank.size() == rows_sum_.size() && rec.routed_load_by_rank.size() == load_sum_.size(),
             "per-rank figures of {} rows and {} loads, the job has {} ranks x {} layers x {} experts",
             rec.routed_rows_by_rank.size(), rec.routed_load_by_rank.size(), ranks_, layers_, experts_);
  seen_ = true;
  if (load_ring_.size() < std::size_t(window_)) {
    load_ring_.push_back(rec.routed_load_by_rank);
    rows_ring_.push_back(rec.routed_rows_by_rank);
  } else {
    for (std::size_t i = 0; i < load_sum_.size(); ++i) load_sum_[i] -= load_ring_[next_][i];
    for (std::size_t i = 0; i < rows_sum_.size(); ++i) rows_sum_[i] -= rows_ring_[next_][i];
    load_ring_[next_] = rec.routed_load_by_rank;
    rows_ring_[next_] = rec.routed_rows_by_rank;
    next_ = (next_ + 1) % load_ring_.size();
  }
  for (std::size_t i = 0; i < load_sum_.size(); ++i) load_sum_[i] += rec.routed_load_by_rank[i];
  for (std::size_t i = 0; i < rows_sum_.size(); ++i) rows_sum_[i] += rec.routed_rows_by_rank[i];
  // Waits: the same number per rank (the layers served this step).
  const std::size_t per_rank = rec.rows_wait_by_rank.size() / std::size_t(ranks_);
  for (int r = 0; r < ranks_; ++r)
    for (std::size_t i = 0; i < per_rank && rec.answers_wait_by_rank.size() == rec.rows_wait_by_rank.size(); ++i) {
      rows_wait_[std::size_t(r)].add(rec.rows_wait_by_rank[std::size_t(r) * per_rank + i]);
      answers_wait_[std::size_t(r)].add(rec.answers_wait_by_rank[std::size_t(r) * per_rank + i]);
    }
}

std::vector<RankFigures> RankSignals::figures() const {
  if (!seen_) return {};
  std::vector<RankFigures> out(static_cast<std::size_t>(ranks_));
  std::vector<double> load(static_cast<std::size_t>(experts_));
  for (int r = 0; r < ranks_; ++r) {
    RankFigures& f = out[std::size_t(r)];
    double pairs = 0, rows = 0;
    int layers_with_rows = 0;
    for (int l = 0; l < layers_; ++l) {
      const std::size_t row = std::size_t(r) * std::size_t(layers_) + std::size_t(l);
      double layer_pairs = 0;
      for (int e = 0; e < experts_; ++e)
        layer_pairs += load[std::size_t(e)] = double(load_sum_[row * std::size_t(experts_) + std::size_t(e)]);
      pairs += layer_pairs;
      rows += double(rows_sum_[row]);
      if (rows_sum_[row] == 0) continue;  // a layer the rank routed nothing in has no spread
      f.load_std_over_mean += std_over_mean(load);
      ++layers_with_rows;
    }
    if (layers_with_rows) f.load_std_over_mean /= layers_with_rows;
    f.routed = rows > 0;
    f.activation_rate = rows > 0 ? pairs / rows / experts_ : 0.0;
    f.alltoall_p99_ms =
        1e3 * std::max(rows_wait_[std::size_t(r)].quantile(0.99), answers_wait_[std::size_t(r)].quantile(0.99));
  }
  return out;
}

}  // namespace moed::runtime
