#include "common/recent_samples.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "common/error.h"

namespace moed {

RecentSamples::RecentSamples(std::size_t capacity) : capacity_(capacity) {
  MOED_CHECK(capacity > 0, "a window of no samples");
  values_.reserve(capacity);
}

void RecentSamples::add(double value) {
  if (values_.size() < capacity_) {
    values_.push_back(value);
    return;
  }
  values_[next_] = value;
  next_ = (next_ + 1) % capacity_;
}

// Summed afresh each time: a running sum would drift as values leave it.
double RecentSamples::sum() const { return std::accumulate(values_.begin(), values_.end(), 0.0); }

double RecentSamples::quantile(double q) const {
  if (values_.empty()) return 0;
  std::vector<double> sorted = values_;
  const std::size_t rank = std::size_t(std::max(1.0, std::ceil(q * double(sorted.size()))));
  const auto at = sorted.begin() + std::ptrdiff_t(std::min(rank, sorted.size()) - 1);
  std::nth_element(sorted.begin(), at, sorted.end());
  return *at;
}

}  // namespace moed
