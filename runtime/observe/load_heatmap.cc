#include "runtime/observe/load_heatmap.h"

#include <algorithm>

#include "common/error.h"

namespace moed::runtime {

LoadHeatmap::LoadHeatmap(int layers, int experts, int columns, int column_steps)
    : layers_(layers), experts_(experts), columns_(columns), column_steps_(column_steps) {
  MOED_CHECK(layers > 0 && experts > 0 && columns >= 0 && column_steps > 0,
             "a heatmap of {} layers, {} experts, {} columns of {} steps", layers, experts, columns, column_steps);
  open_.load.assign(std::size_t(layers) * std::size_t(experts), 0);
}

void LoadHeatmap::add_step(const std::vector<std::uint64_t>& expert_load) {
  if (columns_ == 0) return;
  MOED_CHECK(expert_load.size() == open_.load.size(), "heatmap: {} expert loads, the model has {} layers x {} experts",
             expert_load.size(), layers_, experts_);
  if (open_steps_ == 0) open_.first_step = steps_;
  for (std::size_t i = 0; i < expert_load.size(); ++i) open_.load[i] += expert_load[i];
  open_.last_step = steps_++;
  if (++open_steps_ < column_steps_) return;
  if (ring_.size() < std::size_t(columns_)) {
    ring_.push_back(open_);
  } else {
    ring_[next_] = open_;
    next_ = (next_ + 1) % ring_.size();
  }
  std::fill(open_.load.begin(), open_.load.end(), 0);
  open_steps_ = 0;
}

std::vector<LoadHeatmap::Column> LoadHeatmap::layer(int l) const {
  MOED_CHECK(l >= 0 && l < layers_, "heatmap: layer {} of {}", l, layers_);
  std::vector<Column> out;
  out.reserve(ring_.size());
  for (std::size_t i = 0; i < ring_.size(); ++i) {
    const Column& c = ring_[(next_ + i) % ring_.size()];
    const auto first = c.load.begin() + std::ptrdiff_t(std::size_t(l) * std::size_t(experts_));
    out.push_back({c.first_step, c.last_step, {first, first + experts_}});
  }
  return out;
}

}  // namespace moed::runtime
