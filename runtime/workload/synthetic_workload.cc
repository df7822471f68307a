#include "runtime/workload/synthetic_workload.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "common/error.h"
#include "runtime/workload/trace_workload.h"

namespace moed::runtime {

namespace {

constexpr int kCalibrationSamples = 20000;
constexpr double kMaxSkew = 12.0;
constexpr float kNoise = 0.5f;  // per-coordinate noise against a signal of about 1

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
  chosen.clear();
  double u = rng.uniform();
  std::size_t topic = std::min<std::size_t>(
      std::upper_bound(topic_cdf_.begin(), topic_cdf_.end(), u) - topic_cdf_.begin(),
      topics_.size() - 1);
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

SyntheticWorkload::SyntheticWorkload(const Config& c, const float* gate0)
    : hidden_(int(c.model.hidden)),
      experts_(int(c.model.experts)),
      seed_(std::uint64_t(c.workload.seed)),
      mixture_(TopicMixture::calibrate(int(c.model.experts), int(c.model.top_k),
                                       int(c.workload.topic_size), c.workload.cross_topic,
                                       c.workload.hot_ratio, std::uint64_t(c.workload.seed))),
      directions_(gate0, gate0 + std::size_t(c.model.experts) * c.model.hidden) {
  for (int e = 0; e < experts_; ++e) {
    float* d = directions_.data() + std::size_t(e) * hidden_;
    double norm = 0;
    for (int i = 0; i < hidden_; ++i) norm += double(d[i]) * d[i];
    float inv = norm > 0 ? float(1.0 / std::sqrt(norm)) : 0.0f;
    for (int i = 0; i < hidden_; ++i) d[i] *= inv;
  }
}

void SyntheticWorkload::tokens(std::uint64_t first, std::size_t count, float* hidden) const {
  std::vector<int> chosen;
  const float signal = std::sqrt(float(hidden_));  // a unit direction scaled to RMS 1 per coordinate
  for (std::size_t t = 0; t < count; ++t) {
    std::uint64_t id = first + t;
    Rng rng(hash_combine(seed_, id));
    mixture_.sample(rng, chosen);
    float* x = hidden + t * hidden_;
    CounterRng noise(hash_combine(seed_ ^ 0x5bd1e995ull, id));
    for (int i = 0; i < hidden_; ++i) x[i] = kNoise * noise.normalish(i);
    // Weights falling linearly from 1 to 1 - spread, so the router ranks the
    // experts as drawn and even the last one stands out of the noise.
    const float spread = 0.1f + 0.35f * rng.uniform();
    for (std::size_t j = 0; j < chosen.size(); ++j) {
      const float c = 1.0f - spread * float(j) / float(chosen.size());
      const float* d = directions_.data() + std::size_t(chosen[j]) * hidden_;
      for (int i = 0; i < hidden_; ++i) x[i] += c * signal * d[i];
    }
  }
}

std::string SyntheticWorkload::describe() const {
  return fmt::format("synthetic topics: {} topics of {} experts, skew {:.2f}",
                     mixture_.topics().size(), mixture_.topics().front().size(), mixture_.skew());
}

std::unique_ptr<Workload> make_workload(const Config& config, const float* gate0) {
  if (config.workload.kind == "trace") return std::make_unique<TraceWorkload>(config);
  return std::make_unique<SyntheticWorkload>(config, gate0);
}

}  // namespace moed::runtime
