#include "common/summary_stats.h"

#include <algorithm>
#include <cmath>
#include <numeric>

namespace moed {

double percentile(std::vector<double> samples, double q) {
  if (samples.empty()) return 0;
  std::sort(samples.begin(), samples.end());
  double pos = std::clamp(q, 0.0, 1.0) * double(samples.size() - 1);
  std::size_t lo = static_cast<std::size_t>(pos);
  std::size_t hi = std::min(lo + 1, samples.size() - 1);
  return samples[lo] + (samples[hi] - samples[lo]) * (pos - double(lo));
}

double mean(const std::vector<double>& v) {
  return v.empty() ? 0 : std::accumulate(v.begin(), v.end(), 0.0) / double(v.size());
}

double std_over_mean(const std::vector<double>& v) {
  double m = mean(v);
  if (m == 0) return 0;
  double ss = 0;
  for (double x : v) ss += (x - m) * (x - m);
  return std::sqrt(ss / double(v.size())) / m;
}

double max_over_mean(const std::vector<double>& v) {
  double m = mean(v);
  return m == 0 ? 0 : *std::max_element(v.begin(), v.end()) / m;
}

}  // namespace moed
