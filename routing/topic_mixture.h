// A topic mixture: which experts a token is routed to, as a seeded, pure
// model of a trained router's behaviour. Experts are grouped into topics
// (groups routed together: co-activation), topic popularity is skewed so the
// hottest expert carries a chosen multiple of the mean load (calibrated by
// bisection), and a share of choices leaves the topic. The synthetic workload
// aims its tokens with it; synthetic routing traces are drawn from it.
#pragma once

#include <cstdint>
#include <vector>

#include "common/rng.h"

namespace moed::routing {

class TopicMixture {
 public:
  // Groups experts into topics of topic_size (0: 2 x top_k) and finds the
  // popularity skew that gives the hot ratio; Usage error if out of reach.
  static TopicMixture calibrate(int experts, int top_k, int topic_size, double cross_topic,
                                double hot_ratio, std::uint64_t seed);

  // top_k distinct experts for one token, most weighted first: a topic by
  // popularity, then experts from it (draw_topic, then sample_from).
  void sample(Rng& rng, std::vector<int>& chosen) const;
  int draw_topic(Rng& rng) const;
  void sample_from(int topic, Rng& rng, std::vector<int>& chosen) const;
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

}  // namespace moed::routing
