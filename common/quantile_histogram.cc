#include "common/quantile_histogram.h"

#include <algorithm>
#include <cmath>

namespace moed {

double QuantileHistogram::relative_error() { return std::exp2(0.5 / kSubBuckets) - 1; }

int QuantileHistogram::bucket_of(double value) {
  if (!(value > kMinValue)) return 0;  // NaN and non-positive values too
  const double position = std::log2(value / kMinValue) * kSubBuckets;
  return int(std::min(position, double(kBuckets - 1)));
}

double QuantileHistogram::middle_of(int bucket) {
  return kMinValue * std::exp2((double(bucket) + 0.5) / kSubBuckets);
}

void QuantileHistogram::add(double value) {
  ++counts_[std::size_t(bucket_of(value))];
  if (count_ == 0 || value < min_) min_ = value;
  if (count_ == 0 || value > max_) max_ = value;
  ++count_;
  sum_ += value;
}

double QuantileHistogram::quantile(double q) const {
  if (count_ == 0) return 0;
  q = std::clamp(q, 0.0, 1.0);
  const auto rank = std::max<std::uint64_t>(1, std::uint64_t(std::ceil(q * double(count_))));
  if (rank == 1) return min_;  // the extremes are kept exactly
  if (rank >= count_) return max_;
  std::uint64_t seen = 0;
  for (int b = 0; b < kBuckets; ++b) {
    seen += counts_[std::size_t(b)];
    if (seen >= rank) return std::clamp(middle_of(b), min_, max_);
  }
  return max_;
}

}  // namespace moed
