#include "runtime/engine.h"

#include <algorithm>

#include "common/clock.h"
#include "common/error.h"
#include "kernels/cpu/fixed_combine.h"
#include "kernels/cpu/rms_norm.h"

namespace moed::runtime {

Engine::Engine(const Config& config, comm::Transport& transport, const placement::Topology& topology,
               const placement::Placement& placement, const ExpertStore& store,
               const Workload* workload)
    : config_(config),
      transport_(transport),
      topology_(topology),
      placement_(placement),
      store_(store),
      workload_(workload),
      shape_(store.shape()),
      router_(RouterParams::from(config)),
      tokens_per_step_(std::uint64_t(config.workload.tokens_per_step)),
      order_(tokens_per_step_, config.workload.order == "shuffled", std::uint64_t(config.workload.seed)) {
  const std::uint64_t R = std::uint64_t(transport.size()), r = std::uint64_t(transport.rank());
  first_ = tokens_per_step_ * r / R;
  count_ = std::size_t(tokens_per_step_ * (r + 1) / R - first_);
  // The router's logits come from the fixed-order GEMM whatever [experts].gemm
  // says: a token's routing never depends on its batch.
  for (int l = 0; l < shape_.layers; ++l)
    gate_.emplace_back(store.layer(l).gate.data(), std::size_t(shape_.experts), std::size_t(shape_.hidden));
  counts_ = ExpertCounts(transport.size(), shape_.experts);
  hierarchical_ = config.comm.hierarchical && topology.islands() > 1;
  routing_.resize(shape_.layers);
  size_send_.resize(R);
  size_recv_.resize(R);
}

void Engine::record_stats_into(placement::RoutingStats* stats, std::size_t follow_tokens) {
  stats_ = stats;
  paths_.reset();
  if (stats && !workload_)
    paths_.emplace(shape_.layers, int(std::max(config_.model.top_k, config_.router.max_k)), follow_tokens);
}

StepRecord Engine::run_step(std::uint64_t step, std::vector<float>& x) {
  MOED_CHECK(workload_, "run_step without a workload");
  StepRecord rec;
  rec.expert_load.assign(std::size_t(shape_.layers) * shape_.experts, 0);
  const double start = now_seconds();
  x.resize(count_ * shape_.hidden);
  fetch_tokens(step, x.data());
  for (int l = 0; l < shape_.layers; ++l)
    run_layer(l, step, x.data(), count_, step * tokens_per_step_ + first_, rec);
  if (stats_) record_stats();
  rec.total = now_seconds() - start;
  return rec;
}

std::vector<std::uint32_t> Engine::agree_layer_counts(const std::vector<LayerRows>& mine, std::uint64_t step) {
  const std::size_t L = std::size_t(shape_.layers);
  std::vector<std::uint32_t> local(L, 0), all(L * std::size_t(transport_.size()));
  for (std::size_t l = 0; l < std::min(L, mine.size()); ++l) local[l] = std::uint32_t(mine[l].rows);
  transport_.all_gather(local.data(), L * sizeof(std::uint32_t), all.data(),
                        fmt::format("rows per layer of step {}", step));
  return all;
}

StepRecord Engine::run_layers(std::uint64_t step, std::vector<LayerRows>& layers,
                              const std::vector<std::uint32_t>& counts) {
  const std::size_t L = std::size_t(shape_.layers), R = std::size_t(transport_.size()),
                    me = std::size_t(transport_.rank());
  MOED_CHECK(layers.size() == L && counts.size() == L * R, "run_layers: {} layers, {} counts", layers.size(),
             counts.size());
  StepRecord rec;
  rec.expert_load.assign(L * std::size_t(shape_.experts), 0);
  const double start = now_seconds();
  for (std::size_t l = 0; l < L; ++l) {
    std::uint64_t total = 0, before = 0;
    for (std::size_t r = 0; r < R; ++r) {
      total += counts[r * L + l];
      if (r < me) before += counts[r * L + l];
    }
    if (total == 0) continue;  // no rank has rows for this layer: no collective either
    LayerRows& in = layers[l];
    run_layer(int(l), step, in.x, in.rows, before, rec);
    if (paths_)
      for (std::size_t t = 0; t < in.rows; ++t)
        paths_->observe(in.request_ids[t], in.positions[t], int(l), routing_[l].experts_of(t), *stats_);
  }
  rec.total = now_seconds() - start;
  return rec;
}

void Engine::fetch_tokens(std::uint64_t step, float* x) {
  order_.ids(step, first_, count_, ids_);
  if (!order_.shuffled()) return workload_->tokens(ids_.empty() ? 0 : ids_[0], count_, x);
  for (std::size_t t = 0; t < count_; ++t) workload_->tokens(ids_[t], 1, x + t * std::size_t(shape_.hidden));
}

void Engine::fetch_routing(int layer, Routing& routing) const {
  if (!order_.shuffled()) return workload_->routing(ids_.empty() ? 0 : ids_[0], count_, layer, routing);
  for (std::uint64_t id : ids_) workload_->routing(id, 1, layer, routing);
}

void Engine::record_stats() {
  std::vector<std::span<const std::uint32_t>> path(shape_.layers);
  for (std::size_t t = 0; t < count_; ++t) {
    for (int l = 0; l < shape_.layers; ++l) {
      path[l] = routing_[l].experts_of(t);
      stats_->add_choice(l, path[l]);
      if (l > 0) stats_->add_transition(l - 1, path[l - 1], path[l]);
    }
    stats_->add_sample(path);
  }
}

ReceivedRows Engine::send_rows(const std::vector<RowBatch>& batches, Hop& hop, const std::string& what,
                               StepRecord& rec, double& exchange_seconds) {
  const int H = shape_.hidden, R = transport_.size(), me = transport_.rank();
  pack_rows(batches, H, hop.send, hop.out);
  for (int d = 0; d < R; ++d) size_send_[d] = hop.out.send_bytes[d];
  double t0 = now_seconds();
  transport_.exchange_sizes(size_send_.data(), size_recv_.data(), "sizes of " + what);
  exchange_seconds += now_seconds() - t0;
  hop.out.recv_bytes.assign(size_recv_.begin(), size_recv_.end());
  hop.out.recv_offsets = comm::ExchangeLayout::prefix_offsets(hop.out.recv_bytes);
  hop.recv.resize(hop.out.recv_total());
  t0 = now_seconds();
  transport_.exchange(hop.send.data(), hop.out, hop.recv.data(), what);
  exchange_seconds += now_seconds() - t0;
  for (int d = 0; d < R; ++d) rec.bytes_sent[int(topology_.link(me, d))] += hop.out.send_bytes[d];
  return parse_rows(hop.recv.data(), hop.out, H);
}

void Engine::answer(const std::vector<RowBatch>& sent, Hop& hop, const std::vector<std::byte>& send,
                    const std::string& what, StepRecord& rec, double& exchange_seconds) {
  const int H = shape_.hidden, R = transport_.size(), me = transport_.rank();
  hop.back.recv_bytes = combine_message_bytes(sent, H);  // the answers to what this rank sent
  hop.back.recv_offsets = comm::ExchangeLayout::prefix_offsets(hop.back.recv_bytes);
  hop.back_recv.resize(hop.back.recv_total());
  const double t0 = now_seconds();
  transport_.exchange(send.data(), hop.back, hop.back_recv.data(), what);
  exchange_seconds += now_seconds() - t0;
  for (int d = 0; d < R; ++d) rec.bytes_sent[int(topology_.link(me, d))] += hop.back.send_bytes[d];
}

void Engine::run_layer(int layer, std::uint64_t step, float* x, std::size_t count, std::uint64_t first_position,
                       StepRecord& rec) {
  const int H = shape_.hidden, E = shape_.experts, me = transport_.rank();
  const std::string where = fmt::format("step {} layer {}", step, layer);
  double t0 = now_seconds();

  // route: normalise, then the router (or the trace) picks experts.
  xn_.resize(count * H);
  kernels::rms_norm(x, store_.layer(layer).norm.data(), count, H,
                    float(config_.model.norm_eps), xn_.data());
  Routing& routing = routing_[layer];
  routing.clear();
  if (workload_ && workload_->replays_routing()) {
    fetch_routing(layer, routing);
  } else {
    logits_.resize(count * E);
    kernels::gemm_fixed_order(xn_.data(), count, gate_[layer], logits_.data());
    route(logits_.data(), count, E, router_, routing);
  }
  double t1 = now_seconds();

  // plan: every rank learns every rank's per-expert counts, then plans its sends.
  std::vector<std::uint32_t> mine = ExpertCounts::local(routing, E);
  transport_.all_gather(mine.data(), mine.size() * sizeof(std::uint32_t), counts_.data(),
                        "expert counts of " + where);
  PlanInput in{&routing, &placement_, layer, &counts_, me, std::uint64_t(config_.experts.chunk_rows),
               step, &topology_, hierarchical_, first_position};
  DispatchPlan plan = plan_dispatch(in, xn_.data(), H);
  double t2 = now_seconds();

  // dispatch: hop 1 to the gateways of remote islands (hierarchical only),
  // which add what they received to their hop 2; then hop 2 inside islands.
  double dispatch_exchange = 0, combine_exchange = 0;
  ReceivedRows hop1;
  if (hierarchical_) {
    hop1 = send_rows(plan.hop1, hop1_, "dispatch hop 1 of " + where, rec, dispatch_exchange);
    plan_forward(hop1, H, plan);
  }
  ReceivedRows hop2 = send_rows(plan.hop2, hop2_, "dispatch of " + where, rec, dispatch_exchange);
  double t3 = now_seconds();

  // experts: this rank's chunks, answers written straight into the combine messages.
  std::vector<ExpertBatch> batches = batch_by_expert(hop2, in);
  rec.saturated += executor_.run(store_, layer, hop2, batches, hop2_.back_send, hop2_.back);
  double t4 = now_seconds();

  // combine: hop-2 answers return to their senders: into the home rank's
  // exact sums, or a gateway's; gateways answer across islands (hop 1).
  acc_.assign(count * H, 0);
  GatewayAnswers gateway;
  if (hierarchical_) gateway = prepare_gateway_answers(hop1, H);
  answer(plan.hop2, hop2_, hop2_.back_send, "combine of " + where, rec, combine_exchange);
  rec.saturated += accumulate_answers(plan.hop2, hop2_.back_recv.data(), hop2_.back, H, acc_.data(),
                                      hierarchical_ ? &gateway : nullptr);
  if (hierarchical_) {
    hop1_.back = gateway.layout;
    answer(plan.hop1, hop1_, gateway.send, "combine hop 1 of " + where, rec, combine_exchange);
    rec.saturated += accumulate_answers(plan.hop1, hop1_.back_recv.data(), hop1_.back, H, acc_.data(), nullptr);
  }
  kernels::residual_from_fixed(x, acc_.data(), count * H, x);
  double t6 = now_seconds();

  rec.route += t1 - t0;
  rec.plan += t2 - t1;
  rec.dispatch += t3 - t2;
  rec.experts += t4 - t3;
  rec.combine += t6 - t4;
  rec.dispatch_exchange.push_back(dispatch_exchange);
  rec.combine_exchange.push_back(combine_exchange);
  rec.token_layers += count;
  for (int e = 0; e < E; ++e) {
    std::uint64_t load = counts_.total(e);
    rec.expert_load[std::size_t(layer) * E + e] = load;
    rec.pairs += load;
  }
}

}  // namespace moed::runtime
