// Small statistics over samples: percentiles, mean, spread.
#pragma once

#include <cstddef>
#include <vector>

namespace moed {

// q in [0, 1]; linear interpolation between order statistics. 0 for no samples.
double percentile(std::vector<double> samples, double q);
double mean(const std::vector<double>& v);
// Population standard deviation over mean; 0 when the mean is 0.
double std_over_mean(const std::vector<double>& v);
double max_over_mean(const std::vector<double>& v);

}  // namespace moed
