// The synthetic workload: tokens drawn from a mixture of topics, each topic a
// group of experts that are routed together, with topic popularity skewed so
// the hottest expert carries [workload].hot_ratio times the mean load (OLMoE's
// measured routing: 2.5-3x).
//
// A token is built to be routed where its topic says: its hidden state points
// along the (normalised) gate rows of the experts it was drawn for, with
// decreasing weight, plus noise. The router still decides, from the logits.
//
// With [workload].positions_per_request > 1 a token is a position of a
// request (token_order.h): sqrt(1 - d^2) x its request's draw + d x a draw of
// its own (d = [workload].position_drift), so a request's consecutive
// positions are near-identical tokens, now and then near a routing tie.
#pragma once

#include <cstdint>
#include <vector>

#include "routing/topic_mixture.h"
#include "runtime/workload/workload.h"

namespace moed::runtime {

class SyntheticWorkload final : public Workload {
 public:
  SyntheticWorkload(const Config& config, const float* gate0);
  void tokens(std::uint64_t first, std::size_t count, float* hidden) const override;
  std::string describe() const override;
  const routing::TopicMixture& mixture() const { return mixture_; }

 private:
  // Adds scale x the token drawn for `key` (topics, weights and noise) to x.
  void draw(std::uint64_t key, float scale, float* x) const;

  int hidden_, experts_;
  std::uint64_t seed_;
  std::uint64_t tokens_per_step_, positions_per_request_;
  float drift_;
  routing::TopicMixture mixture_;
  std::vector<float> directions_;  // normalised gate rows of layer 0, [experts, hidden]
};

}  // namespace moed::runtime
