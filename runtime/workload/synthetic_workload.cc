#include "runtime/workload/synthetic_workload.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "common/error.h"
#include "kernels/cpu/normalish.h"
#include "runtime/workload/token_order.h"
#include "runtime/workload/trace_workload.h"

namespace moed::runtime {

namespace {

constexpr float kNoise = 0.5f;  // per-coordinate noise against a signal of about 1

}  // namespace

SyntheticWorkload::SyntheticWorkload(const Config& c, const float* gate0)
    : hidden_(int(c.model.hidden)),
      experts_(int(c.model.experts)),
      seed_(std::uint64_t(c.workload.seed)),
      tokens_per_step_(std::uint64_t(c.workload.tokens_per_step)),
      positions_per_request_(std::uint64_t(c.workload.positions_per_request)),
      drift_(float(c.workload.position_drift)),
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

void SyntheticWorkload::draw(std::uint64_t key, float scale, float* x) const {
  std::vector<int> chosen;
  const float signal = std::sqrt(float(hidden_));  // a unit direction scaled to RMS 1 per coordinate
  Rng rng(hash_combine(seed_, key));
  mixture_.sample(rng, chosen);
  // x[i] += scale * kNoise * CounterRng(...).normalish(i), vectorised.
  kernels::add_normalish(hash_combine(seed_ ^ 0x5bd1e995ull, key), scale * kNoise, x, std::size_t(hidden_));
  // Weights falling linearly from 1 to 1 - spread, so the router ranks the
  // experts as drawn and even the last one stands out of the noise.
  const float spread = 0.1f + 0.35f * rng.uniform();
  for (std::size_t j = 0; j < chosen.size(); ++j) {
    const float c = 1.0f - spread * float(j) / float(chosen.size());
    const float* d = directions_.data() + std::size_t(chosen[j]) * hidden_;
    // x[i] += scale * c * signal * d[i], the product left to right as before.
    kernels::add_scaled(scale * c * signal, d, x, std::size_t(hidden_));
  }
}

void SyntheticWorkload::tokens(std::uint64_t first, std::size_t count, float* hidden) const {
  for (std::size_t t = 0; t < count; ++t) {
    const std::uint64_t id = first + t;
    float* x = hidden + t * hidden_;
    std::fill(x, x + hidden_, 0.0f);
    // One position per request: the token is drawn from its id (as before requests existed).
    if (positions_per_request_ == 1) {
      draw(id, 1.0f, x);
      continue;
    }
    // A position: its request's draw, plus a share (the drift) of a draw of its own.
    const TokenTag tag = request_of_token(id, tokens_per_step_, positions_per_request_);
    draw(tag.request, std::sqrt(1.0f - drift_ * drift_), x);
    if (drift_ > 0) draw(hash_combine(hash_combine(0x27d4eb2full, tag.request), tag.position), drift_, x);
  }
}

std::string SyntheticWorkload::describe() const {
  std::string text = fmt::format("synthetic topics: {} topics of {} experts, skew {:.2f}", mixture_.topics().size(),
                                 mixture_.topics().front().size(), mixture_.skew());
  if (positions_per_request_ > 1)
    text += fmt::format("; requests of {} positions (drift {})", positions_per_request_, drift_);
  return text;
}

std::unique_ptr<Workload> make_workload(const Config& config, const float* gate0) {
  if (config.workload.kind == WorkloadKind::ingress) return nullptr;
  if (config.workload.kind == WorkloadKind::trace) return std::make_unique<TraceWorkload>(config);
  return std::make_unique<SyntheticWorkload>(config, gate0);
}

}  // namespace moed::runtime
