#include "runtime/engine/route_stage.h"

#include "common/error.h"
#include "common/rng.h"
#include "kernels/cpu/rms_norm.h"
#include "runtime/router/policies/jitter.h"
#if MOED_HAVE_CUDA_EXECUTOR
#include "runtime/engine/cuda_router.h"
#endif

namespace moed::runtime {

bool device_can_route(const RouterPolicies& policies) {
  return !policies.shares_tokens() && !policies.measures_jitter();
}

std::unique_ptr<DeviceRouter> make_device_router(ExpertDevice device, const Config& config, const ExpertStore& store,
                                                 int gpu) {
  if (device == ExpertDevice::cpu) return nullptr;
#if MOED_HAVE_CUDA_EXECUTOR
  return std::make_unique<CudaRouter>(config, store, gpu);
#else
  static_cast<void>(config), static_cast<void>(store), static_cast<void>(gpu);
  MOED_THROW(Usage, "no {} router in this build: routing runs on the CPU ([experts].device = cpu)", to_string(device));
#endif
}

RouteStage::RouteStage(const Config& config, comm::Transport& transport, const placement::Placement& placement,
                       const ExpertStore& store, std::unique_ptr<DeviceRouter> device_router)
    : config_(config),
      transport_(transport),
      placement_(placement),
      store_(store),
      router_(RouterParams::from(config)),
      policies_(config, store.shape().layers, store.shape().experts),
      device_router_(std::move(device_router)) {
  // The router's logits come from the fixed-order GEMM whatever [experts].gemm
  // says: a token's routing never depends on its batch.
  const ModelShape& shape = store.shape();
  for (int l = 0; l < shape.layers; ++l)
    gate_.emplace_back(store.layer(l).gate.data(), std::size_t(shape.experts), std::size_t(shape.hidden));
}

void RouteStage::gate_logits(int layer, const float* xn, std::size_t count, float* logits) const {
  const std::size_t E = std::size_t(store_.shape().experts);
  kernels::gemm_fixed_order(xn, count, gate_[std::size_t(layer)], logits);
  const std::vector<float>& bias = store_.layer(layer).gate_bias;  // gpt-oss's router.bias
  if (bias.empty()) return;
  for (std::size_t t = 0; t < count; ++t)
    for (std::size_t e = 0; e < E; ++e) logits[t * E + e] += bias[e];
}

RouterParams RouteStage::router_of(int layer) const {
  return router_.at_layer(store_.layer(layer).selection_bias);
}

void RouteStage::run(const Rows& rows, bool replayed, Routing& routing, StepRecord& rec) {
  const int H = store_.shape().hidden;
  xn_.resize(rows.count * H);
  // The device computes the router's choice with the same bits, with the
  // balancing bias's adjustments too; then, as choose_experts does, the
  // plain selection, to count the pairs the bias changed.
  if (device_router_ && !replayed && device_can_route(policies_)) {
    const double* adjust = policies_.adjustments(rows.layer, rows.tags, adjust_);
    device_router_->route(rows.layer, rows.x, rows.count, xn_.data(), routing, adjust);
    if (!adjust || !policies_.rebalances()) return;
    plain_routing_.clear();
    device_router_->route(rows.layer, rows.x, rows.count, xn_.data(), plain_routing_,
                          policies_.adjustments(rows.layer, rows.tags, plain_adjust_, false));
    rec.router.selected += plain_routing_.experts.size();
    rec.router.changed += lost_pairs(plain_routing_, routing);
    return;
  }
  if (!replayed) {
    logits_.resize(rows.count * std::size_t(store_.shape().experts));
    norm_and_gate(rows.layer, rows.x, rows.count, xn_.data(), logits_.data());
    if (!choose_experts(rows, routing, rec)) return;
  } else {
    kernels::rms_norm(rows.x, store_.layer(rows.layer).norm.data(), rows.count, H, float(config_.model.norm_eps),
                      xn_.data());
    if (!policies_.shares_tokens()) return;  // replayed as recorded
    plain_routing_ = routing;
    // Only a load policy applies to replayed routing: its experts are the candidates.
    ranked_.clear();
    for (std::size_t t = 0; t < routing.tokens(); ++t) {
      for (std::size_t i = 0; i < routing.experts_of(t).size(); ++i) {
        ranked_.experts.push_back(routing.experts_of(t)[i]);
        // The recorded weights are final: back to scores, which choose() scales again.
        ranked_.probs.push_back(double(routing.weights_of(t)[i]) / router_.spec.scaling);
      }
      ranked_.end_token(std::uint32_t(routing.experts_of(t).size()));
    }
    routing.clear();
    share_and_decide(rows, routing, rec);
  }
  if (!policies_.rebalances()) return;
  rec.router.selected += plain_routing_.experts.size();
  rec.router.changed += lost_pairs(plain_routing_, routing);
}

void RouteStage::norm_and_gate(int layer, const float* x, std::size_t count, float* xn, float* logits) {
  if (device_router_) return device_router_->norm_and_gate(layer, x, count, xn, logits);
  kernels::rms_norm(x, store_.layer(layer).norm.data(), count, store_.shape().hidden, float(config_.model.norm_eps),
                    xn);
  gate_logits(layer, xn, count, logits);
}

bool RouteStage::choose_experts(const Rows& rows, Routing& routing, StepRecord& rec) {
  const std::size_t E = std::size_t(store_.shape().experts);
  const RouterParams router = router_of(rows.layer);
  const double* adjust = policies_.adjustments(rows.layer, rows.tags, adjust_);
  if (!adjust && !policies_.shares_tokens()) {
    route(logits_.data(), rows.count, E, router, routing);
    return false;
  }
  ranked_.clear();
  rank_experts(logits_.data(), adjust, rows.count, E, router, policies_.extra_candidates(), ranked_);
  if (policies_.measures_jitter()) measure_jitter(rows, adjust, rec);
  if (policies_.rebalances()) plain_selection(rows);
  if (policies_.shares_tokens())
    share_and_decide(rows, routing, rec);
  else
    choose(ranked_, router_.spec, routing);
  return true;
}

void RouteStage::plain_selection(const Rows& rows) {
  plain_routing_.clear();
  // Without the bias, ranked_'s choice is the plain selection: a load policy acts after it.
  if (!policies_.balances()) return choose(ranked_, router_.spec, plain_routing_);
  const double* adjust = policies_.adjustments(rows.layer, rows.tags, plain_adjust_, false);
  plain_ranked_.clear();
  rank_experts(logits_.data(), adjust, rows.count, std::size_t(store_.shape().experts), router_of(rows.layer), 0,
               plain_ranked_);
  choose(plain_ranked_, router_.spec, plain_routing_);
}

void RouteStage::measure_jitter(const Rows& rows, const double* adjust, StepRecord& rec) {
  const std::size_t H = std::size_t(store_.shape().hidden), E = std::size_t(store_.shape().experts);
  const std::size_t count = rows.count;
  jitter_keys_.resize(count);
  for (std::size_t t = 0; t < count; ++t) jitter_keys_[t] = hash_combine(rows.tags[t].request, rows.tags[t].position);
  noisy_.resize(count * H);
  noisy_xn_.resize(count * H);
  noisy_logits_.resize(count * E);
  for (std::size_t i = 0; i < kJitterEps.size(); ++i) {
    perturb_rows(rows.x, count, H, jitter_keys_.data(), rows.layer, kJitterEps[i], noisy_.data());
    norm_and_gate(rows.layer, noisy_.data(), count, noisy_xn_.data(), noisy_logits_.data());
    noisy_ranked_.clear();
    rank_experts(noisy_logits_.data(), adjust, count, E, router_of(rows.layer), 0, noisy_ranked_);
    rec.router.jitter_changed[i] += changed_choices(ranked_, noisy_ranked_);
  }
  rec.router.jitter_tested += count;
}

void RouteStage::share_and_decide(const Rows& rows, Routing& routing, StepRecord& rec) {
  const std::size_t R = rows.rows_of_rank.size(), me = std::size_t(transport_.rank());
  const std::size_t C = policies_.max_candidates(), bytes = record_words(C) * sizeof(std::uint32_t);
  records_.resize(ranked_.tokens() * record_words(C));
  encode_records(ranked_, rows.tags, C, records_.data());
  comm::ExchangeLayout layout;
  layout.send_bytes.assign(R, records_.size() * sizeof(std::uint32_t));
  layout.send_offsets.assign(R, 0);  // the same block to every rank
  std::size_t total = 0, mine_first = 0;
  for (std::size_t r = 0; r < R; ++r) {
    layout.recv_bytes.push_back(rows.rows_of_rank[r] * bytes);
    if (r < me) mine_first += rows.rows_of_rank[r];
    total += rows.rows_of_rank[r];
  }
  layout.recv_offsets = comm::ExchangeLayout::prefix_offsets(layout.recv_bytes);
  all_records_.resize(total * record_words(C));
  transport_.exchange(reinterpret_cast<const std::byte*>(records_.data()), layout,
                      reinterpret_cast<std::byte*>(all_records_.data()), "router candidates of " + *rows.where);
  all_ranked_.clear();
  all_tags_.clear();
  const int E = store_.shape().experts;
  decode_records(all_records_.data(), total, C, std::size_t(E), all_ranked_, all_tags_);
  replicas_.resize(std::size_t(E));
  for (int e = 0; e < E; ++e) replicas_[std::size_t(e)] = std::uint32_t(placement_.replicas(rows.layer, e).size());
  policies_.decide(rows.layer, all_ranked_, all_tags_, mine_first, ranked_.tokens(), replicas_, routing, rec.router);
}

}  // namespace moed::runtime
