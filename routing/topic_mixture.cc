#include "routing/topic_mixture.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "common/error.h"

namespace moed::routing {

namespace {

constexpr int kCalibrationSamples = 20000;
constexpr double kMaxSkew = 12.0;

}  // namespace

TopicMixture TopicMixture::calibrate(int experts, int top_k, int topic_size, double cross_topic,
                                     double hot_ratio, std::uint64_t seed) {
  TopicMixture m;
  m.experts_ = experts;
  m.top_k_ = top_k;
  m.cross_topic_ = cross_topic;
  Rng rng(hash_combine(seed, hash_name("topic-mixture")));

  // A random order of experts: popularity ranks, and the topic groups.
  std::vector<int> order(experts);
  std::iota(order.begin(), order.end(), 0);
  for (int i = experts - 1; i > 0; --i) std::swap(order[i], order[rng.below(i + 1)]);
  m.popularity_rank_.resize(experts);
  for (int i = 0; i < experts; ++i) m.popularity_rank_[order[i]] = i;
  for (int i = experts - 1; i > 0; --i) std::swap(order[i], order[rng.below(i + 1)]);
  int size = topic_size > 0 ? topic_size : std::min(experts, 2 * top_k);
  size = std::max(size, top_k);
  int groups = std::max(1, experts / size);
  m.topics_.assign(groups, {});
  for (int i = 0; i < experts; ++i) m.topics_[i % groups].push_back(order[i]);

  // Bisection on the skew; the hot ratio grows with it (common random numbers).
  std::uint64_t probe_seed = hash_combine(seed, hash_name("calibration"));
  m.set_skew(kMaxSkew);
  double reachable = m.measured_hot_ratio(kCalibrationSamples, probe_seed);
  if (reachable < hot_ratio)
    MOED_THROW(Usage,
               "config: [workload].hot_ratio = {} is out of reach for {} experts, top-{}, topics "
               "of {} and cross_topic {}: at most {:.2f}",
               hot_ratio, experts, top_k, size, cross_topic, reachable);
  double lo = 0, hi = kMaxSkew;
  for (int it = 0; it < 40; ++it) {
    double mid = 0.5 * (lo + hi);
    m.set_skew(mid);
    (m.measured_hot_ratio(kCalibrationSamples, probe_seed) < hot_ratio ? lo : hi) = mid;
  }
  m.set_skew(hi);
  return m;
}

void TopicMixture::set_skew(double s) {
  skew_ = s;
  weight_.resize(experts_);
  for (int e = 0; e < experts_; ++e) weight_[e] = std::pow(double(popularity_rank_[e] + 1), -s);
  topic_cdf_.clear();
  double total = 0;
  for (const auto& t : topics_) {
    for (int e : t) total += weight_[e];
    topic_cdf_.push_back(total);
  }
  for (double& c : topic_cdf_) c /= total;
}

void TopicMixture::sample(Rng& rng, std::vector<int>& chosen) const {
  sample_from(draw_topic(rng), rng, chosen);
}

int TopicMixture::draw_topic(Rng& rng) const {
  double u = rng.uniform();
  return int(std::min<std::size_t>(
      std::upper_bound(topic_cdf_.begin(), topic_cdf_.end(), u) - topic_cdf_.begin(),
      topics_.size() - 1));
}

void TopicMixture::sample_from(int topic, Rng& rng, std::vector<int>& chosen) const {
  chosen.clear();
  const std::vector<int>& group = topics_[topic];
  auto taken = [&](int e) { return std::find(chosen.begin(), chosen.end(), e) != chosen.end(); };
  while (int(chosen.size()) < top_k_) {
    if (rng.uniform() < cross_topic_) {  // leave the topic: any expert not yet chosen
      int e;
      do e = int(rng.below(experts_));
      while (taken(e));
      chosen.push_back(e);
      continue;
    }
    double left = 0;
    for (int e : group)
      if (!taken(e)) left += weight_[e];
    if (left <= 0) {  // the topic is used up (only with cross_topic picks inside it)
      int e;
      do e = int(rng.below(experts_));
      while (taken(e));
      chosen.push_back(e);
      continue;
    }
    double x = rng.uniform() * left;
    int pick = -1;
    for (int e : group) {
      if (taken(e)) continue;
      pick = e;
      if ((x -= weight_[e]) < 0) break;
    }
    chosen.push_back(pick);
  }
}

double TopicMixture::measured_hot_ratio(int samples, std::uint64_t seed) const {
  std::vector<double> load(experts_, 0.0);
  std::vector<int> chosen;
  Rng rng(seed);
  for (int i = 0; i < samples; ++i) {
    sample(rng, chosen);
    for (int e : chosen) load[e] += 1;
  }
  double mean = double(samples) * top_k_ / experts_;
  return *std::max_element(load.begin(), load.end()) / mean;
}

}  // namespace moed::routing
