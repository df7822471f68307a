#include "runtime/workload/synthetic_workload.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "common/error.h"
#include "runtime/workload/trace_workload.h"

namespace moed::runtime {

namespace {

constexpr float kNoise = 0.5f;  // per-coordinate noise against a signal of about 1

}  // namespace

SyntheticWorkload::SyntheticWorkload(const Config& c, const float* gate0)
    : hidden_(int(c.model.hidden)),
      experts_(int(c.model.experts)),
      seed_(std::uint64_t(c.workload.seed)),
      mixture_(routing::TopicMixture::calibrate(int(c.model.experts), int(c.model.top_k),
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
  if (config.workload.kind == "ingress") return nullptr;
  if (config.workload.kind == "trace") return std::make_unique<TraceWorkload>(config);
  return std::make_unique<SyntheticWorkload>(config, gate0);
}

}  // namespace moed::runtime
