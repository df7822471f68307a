#include "routing/topic_mixture.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "common/error.h"

namespace moed::routing {

namespace {

constexpr int kCalibrationSamples = 20000;
constexpr double kMaxSkew = 12.0;
// Rounds of proportional correction in fitted_to_loads.
constexpr int kLoadFitRounds = 12;

// Experts per topic: topic_size, 0 meaning 2 x top_k, never below top_k.
int topic_size_of(int experts, int top_k, int topic_size) {
  return std::max(topic_size > 0 ? topic_size : std::min(experts, 2 * top_k), top_k);
}

}  // namespace

TopicMixture TopicMixture::grouped(int experts, int top_k, int topic_size, double cross_topic,
                                   std::uint64_t seed) {
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
  const int size = topic_size_of(experts, top_k, topic_size);
  const int groups = std::max(1, experts / size);
  m.topics_.assign(groups, {});
  for (int i = 0; i < experts; ++i) m.topics_[i % groups].push_back(order[i]);
  return m;
}

TopicMixture TopicMixture::calibrate(int experts, int top_k, int topic_size, double cross_topic,
                                     double hot_ratio, std::uint64_t seed) {
  TopicMixture m = grouped(experts, top_k, topic_size, cross_topic, seed);
  const int size = topic_size_of(experts, top_k, topic_size);

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

TopicMixture TopicMixture::fitted_to_loads(int experts, int top_k, int topic_size, double cross_topic,
                                           const std::vector<double>& loads, std::uint64_t seed) {
  if (int(loads.size()) != experts)
    MOED_THROW(Usage, "expert loads: {} values for {} experts", loads.size(), experts);
  double total = 0;
  for (double x : loads) {
    if (!(x >= 0) || !std::isfinite(x)) MOED_THROW(Usage, "expert loads: {} is not a load (>= 0, finite)", x);
    total += x;
  }
  if (total <= 0) MOED_THROW(Usage, "expert loads: all {} are 0", experts);
  if (!(cross_topic > 0 && cross_topic <= 1))
    MOED_THROW(Usage, "expert loads: cross_topic {} must be in (0, 1]", cross_topic);
  TopicMixture m = grouped(experts, top_k, topic_size, cross_topic, seed);
  const int size = int(m.topics_.front().size());
  m.boost_ = size < experts ? (1 - cross_topic) * double(experts - size) / (cross_topic * size) : 1;
  m.topic_of_.assign(std::size_t(experts), 0);
  for (std::size_t t = 0; t < m.topics_.size(); ++t)
    for (int e : m.topics_[t]) m.topic_of_[std::size_t(e)] = int(t);
  // An expert never seen keeps a trace of weight, so that it can still be chosen.
  const double floor = 1e-3 * total / experts;
  std::vector<double> target(loads), weight(experts);
  for (int e = 0; e < experts; ++e) weight[e] = target[e] = std::max(target[e], floor) / total;
  const std::uint64_t probe_seed = hash_combine(seed, hash_name("load-fit"));
  for (int round = 0; round < kLoadFitRounds; ++round) {
    m.set_weights(weight);
    const std::vector<double> got = m.measured_loads(kCalibrationSamples, probe_seed);
    const double got_total = std::accumulate(got.begin(), got.end(), 0.0);
    for (int e = 0; e < experts; ++e) {
      const double share = std::max(got[e], 0.5) / got_total;  // half a draw for an expert never drawn
      weight[e] *= std::clamp(target[e] / share, 0.25, 4.0);
    }
  }
  m.set_weights(std::move(weight));
  return m;
}

void TopicMixture::set_skew(double s) {
  skew_ = s;
  std::vector<double> weights(experts_);
  for (int e = 0; e < experts_; ++e) weights[e] = std::pow(double(popularity_rank_[e] + 1), -s);
  set_weights(std::move(weights));
}

void TopicMixture::set_weights(std::vector<double> weights) {
  weight_ = std::move(weights);
  topic_cdf_.clear();
  double total = 0;
  for (const auto& t : topics_) {
    if (boost_ > 0) total += 1;  // leaning topics are drawn uniformly
    else for (int e : t) total += weight_[e];
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

void TopicMixture::sample_boosted(int topic, Rng& rng, std::vector<int>& chosen) const {
  auto weight = [&](int e) { return weight_[std::size_t(e)] * (topic_of_[std::size_t(e)] == topic ? boost_ : 1); };
  double left = 0;
  for (int e = 0; e < experts_; ++e) left += weight(e);
  while (int(chosen.size()) < top_k_) {
    double x = rng.uniform() * left;
    int pick = -1;
    for (int e = 0; e < experts_; ++e) {
      if (std::find(chosen.begin(), chosen.end(), e) != chosen.end()) continue;
      pick = e;
      if ((x -= weight(e)) < 0) break;
    }
    chosen.push_back(pick);
    left -= weight(pick);
  }
}

void TopicMixture::sample_from(int topic, Rng& rng, std::vector<int>& chosen) const {
  chosen.clear();
  if (boost_ > 0) return sample_boosted(topic, rng, chosen);
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

std::vector<double> TopicMixture::measured_loads(int samples, std::uint64_t seed) const {
  std::vector<double> load(experts_, 0.0);
  std::vector<int> chosen;
  Rng rng(seed);
  for (int i = 0; i < samples; ++i) {
    sample(rng, chosen);
    for (int e : chosen) load[e] += 1;
  }
  return load;
}

double TopicMixture::measured_hot_ratio(int samples, std::uint64_t seed) const {
  const std::vector<double> load = measured_loads(samples, seed);
  double mean = double(samples) * top_k_ / experts_;
  return *std::max_element(load.begin(), load.end()) / mean;
}

}  // namespace moed::routing
