#include "runtime/router/policies/router_policies.h"

#include <algorithm>
#include <utility>

#include "common/error.h"
#include "common/log.h"

namespace moed::runtime {

std::array<std::uint64_t, RouterCounters::kWords> RouterCounters::words() const {
  return {tokens, pairs, moved, dropped, weight_moved, weight_dropped, flip_tested, flipped, jitter_tested,
          jitter_changed[0], jitter_changed[1], selected, changed};
}

RouterCounters RouterCounters::from_words(std::span<const std::uint64_t> w) {
  MOED_CHECK(w.size() == kWords, "router counters: {} words", w.size());
  RouterCounters c;
  c.tokens = w[0], c.pairs = w[1], c.moved = w[2], c.dropped = w[3], c.weight_moved = w[4], c.weight_dropped = w[5];
  c.flip_tested = w[6], c.flipped = w[7], c.jitter_tested = w[8];
  c.jitter_changed = {w[9], w[10]};
  c.selected = w[11], c.changed = w[12];
  return c;
}

void RouterCounters::add(const RouterCounters& o) {
  const auto a = words(), b = o.words();
  std::array<std::uint64_t, kWords> sum{};
  for (std::size_t i = 0; i < kWords; ++i) sum[i] = a[i] + b[i];
  *this = from_words(sum);
}

std::string describe_router_policies(const Config& c) {
  const RouterConfig& r = c.router;
  std::vector<std::string> on;
  if (r.smoothing_beta > 0) on.push_back(fmt::format("smoothing beta {}", r.smoothing_beta));
  if (r.load_policy == LoadPolicy::drop) on.push_back(fmt::format("drop over capacity {}", r.capacity_factor));
  if (r.load_policy == LoadPolicy::demote && r.demotion_target > 0)
    on.push_back(fmt::format("demote to load std/mean {}", r.demotion_target));
  else if (r.load_policy == LoadPolicy::demote)
    on.push_back(fmt::format("demote over {} of capacity {}", r.demotion_threshold, r.capacity_factor));
  if (r.bias_gamma > 0) on.push_back(fmt::format("bias balancing gamma {}", r.bias_gamma));
  if (r.measure_jitter) on.emplace_back("jitter measured");
  return fmt::format("{}", fmt::join(on, ", "));
}

RouterPolicies::RouterPolicies(const Config& c, int layers, int experts)
    : layers_(layers),
      experts_(experts),
      beta_(c.router.smoothing_beta),
      load_{c.router.load_policy, c.router.capacity_factor, c.router.demotion_threshold, model_spec(c.model).router,
            c.router.demotion_target},
      measure_jitter_(c.router.measure_jitter) {
  const std::size_t max_k = std::size_t(c.router.mode == RouterMode::topp && c.router.max_k ? c.router.max_k : c.model.top_k);
  extra_ = load_.policy == LoadPolicy::demote ? std::size_t(c.router.demotion_candidates) : 0;
  max_candidates_ = std::min(std::size_t(experts), max_k + extra_);
  if (c.router.bias_gamma > 0) bias_.emplace(layers, experts, c.router.bias_gamma);
  if (beta_ > 0 || measure_jitter_)
    history_.emplace(layers, int(max_k), std::size_t(c.router.smoothing_max_requests),
                     std::uint64_t(c.router.smoothing_idle_steps));
}

std::uint64_t lost_pairs(const Routing& plain, const Routing& final) {
  MOED_CHECK(plain.tokens() == final.tokens(), "lost pairs: {} tokens against {}", plain.tokens(), final.tokens());
  std::uint64_t lost = 0;
  for (std::size_t t = 0; t < plain.tokens(); ++t) {
    const auto now = final.experts_of(t);
    for (std::uint32_t e : plain.experts_of(t)) lost += std::find(now.begin(), now.end(), e) == now.end();
  }
  return lost;
}

const double* RouterPolicies::adjustments(int layer, std::span<const TokenTag> tags, std::vector<double>& out,
                                          bool with_bias) const {
  const bool bias = with_bias && bias_.has_value();
  if (!bias && beta_ <= 0) return nullptr;
  const std::size_t E = std::size_t(experts_);
  out.assign(tags.size() * E, 0.0);
  for (std::size_t t = 0; t < tags.size(); ++t) {
    double* a = out.data() + t * E;
    if (bias) std::copy_n(bias_->layer(layer).data(), E, a);
    // The first position has no previous one: its routing is never changed by smoothing.
    if (beta_ > 0)
      for (std::uint32_t e : history_->previous(tags[t].request, layer, tags[t].position)) a[e] += beta_;
  }
  return out.data();
}

void RouterPolicies::decide(int layer, const Ranked& all, std::span<const TokenTag> tags, std::size_t mine_first,
                            std::size_t mine, std::span<const std::uint32_t> replicas, Routing& mine_out,
                            RouterCounters& counters) {
  MOED_CHECK(tags.size() == all.tokens() && mine_first + mine <= all.tokens(),
             "router policies: {} tags, {} tokens, mine [{}, {})", tags.size(), all.tokens(), mine_first,
             mine_first + mine);
  if (bias_) {
    selection_load_.assign(std::size_t(experts_), 0);
    selection_layer_ = layer;
    for (std::size_t t = 0; t < all.tokens(); ++t)
      for (std::uint32_t e : all.experts_of(t).first(all.chosen[t])) ++selection_load_[e];
  }
  all_routing_.clear();
  const LoadOutcome outcome = apply_load_policy(all, replicas, load_, mine_first, mine, all_routing_);
  counters.tokens += mine;
  counters.pairs += outcome.pairs;
  counters.moved += outcome.moved;
  counters.dropped += outcome.dropped;
  counters.weight_moved += outcome.weight_moved;
  counters.weight_dropped += outcome.weight_dropped;
  for (std::size_t t = 0; t < all.tokens(); ++t) {
    const auto experts = all_routing_.experts_of(t);
    if (history_) {
      const auto change = history_->record(tags[t].request, layer, tags[t].position, experts, steps_);
      if (t >= mine_first && t < mine_first + mine && change != RequestHistory::Change::unknown) {
        ++counters.flip_tested;
        counters.flipped += change == RequestHistory::Change::flipped;
      }
    }
    if (t < mine_first || t >= mine_first + mine) continue;
    const auto weights = all_routing_.weights_of(t);
    for (std::size_t i = 0; i < experts.size(); ++i) mine_out.add(experts[i], weights[i]);
    mine_out.end_token();
  }
}

void RouterPolicies::end_layer(int layer, std::span<const std::uint64_t> load) {
  if (!bias_) return;
  const bool before_policy = load_.policy != LoadPolicy::none && selection_layer_ == layer;
  bias_->update(layer, before_policy ? std::span<const std::uint64_t>(selection_load_) : load);
  selection_layer_ = -1;
}

void RouterPolicies::end_step() {
  if (history_) history_->end_step(steps_);
  ++steps_;
}

void RouterPolicies::set_biases(std::vector<double> values) {
  if (bias_ && !values.empty()) bias_->set_values(std::move(values));
}

}  // namespace moed::runtime
