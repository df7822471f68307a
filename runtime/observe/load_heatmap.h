// The dashboard's expert heatmap: per-expert loads over time, as a ring of
// columns, each the loads summed over `column_steps` measured steps. Only
// the last `columns` complete columns are kept (the open one is not shown
// until it is complete), so memory is columns x layers x experts counts
// whatever the steps served. Pure; not thread-safe (the control plane keeps
// it under its snapshot mutex).
#pragma once

#include <cstdint>
#include <vector>

namespace moed::runtime {

class LoadHeatmap {
 public:
  struct Column {
    std::uint64_t first_step = 0, last_step = 0;  // measured steps, counted from 0
    std::vector<std::uint64_t> load;               // one layer's, per expert (layer(): E values)
  };

  // columns == 0: keeps nothing (the ranks that do not serve the page).
  LoadHeatmap(int layers, int experts, int columns, int column_steps);

  // One measured step's loads, [layer * experts + e] (StepRecord::expert_load).
  void add_step(const std::vector<std::uint64_t>& expert_load);
  // The complete columns of one layer, oldest first.
  std::vector<Column> layer(int l) const;
  int layers() const { return layers_; }
  int experts() const { return experts_; }
  int column_steps() const { return column_steps_; }
  int capacity() const { return columns_; }

 private:
  int layers_, experts_, columns_, column_steps_;
  std::uint64_t steps_ = 0;  // measured steps added
  std::vector<Column> ring_;  // whole columns: load holds layers x experts
  std::size_t next_ = 0;      // once full, the oldest
  Column open_;               // the column being summed
  int open_steps_ = 0;
};

}  // namespace moed::runtime
