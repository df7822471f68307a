// The last `capacity` samples of a figure, in a ring: the recent window
// beside the since-start figures (a slowdown shows in it, where a mean since
// start hardly moves after hours). Memory is fixed at construction.
#pragma once

#include <cstddef>
#include <vector>

namespace moed {

class RecentSamples {
 public:
  explicit RecentSamples(std::size_t capacity);
  void add(double value);
  std::size_t size() const { return values_.size(); }
  double sum() const;
  // Nearest rank over the samples held (0 when none): the smallest sample
  // with at least q of them at or below it.
  double quantile(double q) const;

 private:
  std::size_t capacity_, next_ = 0;
  std::vector<double> values_;
};

}  // namespace moed
