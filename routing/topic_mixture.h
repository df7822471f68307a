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
  // Topics (by seed) that lean a token's choices instead of confining them,
  // so that any loads can be met: a hot expert is chosen by most tokens,
  // whatever their topic, as a trained router's hot experts are. A token
  // draws a topic uniformly, then its top_k experts one at a time without
  // replacement, each with probability proportional to its weight, times a
  // boost for the topic's experts such that with equal weights a choice
  // stays in the topic with probability 1 - cross_topic. The weights are
  // fitted so that each expert's share of the load comes near `loads`
  // (relative: a measured count per expert, such as a text domain's), by
  // rounds of proportional correction on sampled loads. Usage error for a
  // negative, non-finite or all-zero load, or a count other than `experts`.
  static TopicMixture fitted_to_loads(int experts, int top_k, int topic_size, double cross_topic,
                                      const std::vector<double>& loads, std::uint64_t seed);

  // top_k distinct experts for one token, most weighted first: a topic by
  // popularity, then experts from it (draw_topic, then sample_from).
  void sample(Rng& rng, std::vector<int>& chosen) const;
  int draw_topic(Rng& rng) const;
  void sample_from(int topic, Rng& rng, std::vector<int>& chosen) const;
  // Max over mean of expert counts over `samples` draws (fixed seed).
  double measured_hot_ratio(int samples, std::uint64_t seed) const;
  // Each expert's count over `samples` draws (fixed seed).
  std::vector<double> measured_loads(int samples, std::uint64_t seed) const;

  const std::vector<std::vector<int>>& topics() const { return topics_; }
  double skew() const { return skew_; }

 private:
  // Topics grouped and popularity ranks drawn by `seed`, weights unset.
  static TopicMixture grouped(int experts, int top_k, int topic_size, double cross_topic, std::uint64_t seed);
  void set_skew(double s);
  void set_weights(std::vector<double> weights);

  void sample_boosted(int topic, Rng& rng, std::vector<int>& chosen) const;

  int experts_ = 0, top_k_ = 0;
  double cross_topic_ = 0, skew_ = 0;
  double boost_ = 0;                           // > 0: fitted_to_loads's leaning topics
  std::vector<int> topic_of_;                  // expert -> its topic (leaning topics)
  std::vector<int> popularity_rank_;           // expert -> rank in popularity
  std::vector<std::vector<int>> topics_;       // expert groups
  std::vector<double> weight_;                 // expert -> popularity weight
  std::vector<double> topic_cdf_;              // cumulative topic probability
};

}  // namespace moed::routing
