// The synthetic workload: tokens drawn from a mixture of topics, each topic a
// group of experts that are routed together, with topic popularity skewed so
// the hottest expert carries [workload].hot_ratio times the mean load (OLMoE's
// measured routing: 2.5-3x).
//
// A token is built to be routed where its topic says: its hidden state points
// along the (normalised) gate rows of the experts it was drawn for, with
// decreasing weight, plus noise. The router still decides, from the logits.
#pragma once

#include <cstdint>
#include <vector>

#include "common/rng.h"
#include "runtime/workload/workload.h"

namespace moed::runtime {

// Which experts a token is drawn for: pure, seeded, calibrated.
class TopicMixture {
 public:
  // Groups experts into topics of topic_size (0: 2 x top_k) and finds the
  // popularity skew that gives the hot ratio; Usage error if out of reach.
  static TopicMixture calibrate(int experts, int top_k, int topic_size, double cross_topic,
                                double hot_ratio, std::uint64_t seed);

  // top_k distinct experts for one token, most weighted first.
  void sample(Rng& rng, std::vector<int>& chosen) const;
  // Max over mean of expert counts over `samples` draws (fixed seed).
  double measured_hot_ratio(int samples, std::uint64_t seed) const;

  const std::vector<std::vector<int>>& topics() const { return topics_; }
  double skew() const { return skew_; }

 private:
  void set_skew(double s);

  int experts_ = 0, top_k_ = 0;
  double cross_topic_ = 0, skew_ = 0;
  std::vector<int> popularity_rank_;           // expert -> rank in popularity
  std::vector<std::vector<int>> topics_;       // expert groups
  std::vector<double> weight_;                 // expert -> popularity weight
  std::vector<double> topic_cdf_;              // cumulative topic probability
};

class SyntheticWorkload final : public Workload {
 public:
  SyntheticWorkload(const Config& config, const float* gate0);
  void tokens(std::uint64_t first, std::size_t count, float* hidden) const override;
  std::string describe() const override;
  const TopicMixture& mixture() const { return mixture_; }

 private:
  int hidden_, experts_;
  std::uint64_t seed_;
  TopicMixture mixture_;
  std::vector<float> directions_;  // normalised gate rows of layer 0, [experts, hidden]
};

}  // namespace moed::runtime
