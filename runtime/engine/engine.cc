#include "runtime/engine/engine.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "comm/idle_backoff.h"
#include "common/clock.h"
#include "common/error.h"
#include "common/log.h"
#include "kernels/cpu/fixed_combine.h"
#include "kernels/cpu/rms_norm.h"

namespace moed::runtime {

Engine::Engine(const Config& config, comm::Transport& transport, const placement::Topology& topology,
               const placement::Placement& placement, const ExpertStore& store,
               const Workload* workload, ExpertDevice device, int gpu)
    : config_(config),
      transport_(transport),
      topology_(topology),
      placement_(placement),
      store_(store),
      workload_(workload),
      shape_(store.shape()),
      tokens_per_step_(std::uint64_t(config.workload.tokens_per_step)),
      order_(tokens_per_step_, config.workload.order == WorkloadOrder::shuffled, std::uint64_t(config.workload.seed)),
      executor_(make_expert_executor(device, 256, gpu)),
      shared_executor_(make_expert_executor(device, 256, gpu)),
      route_(config, transport, placement, store, make_device_router(device, config, store, gpu)),
      positions_per_request_(std::uint64_t(config.workload.positions_per_request)),
      census_(transport.size(), std::size_t(config.engine.microbatches), store.shape().experts),
      tracer_(std::size_t(config.engine.microbatches)) {
  const std::uint64_t R = std::uint64_t(transport.size()), r = std::uint64_t(transport.rank());
  first_ = tokens_per_step_ * r / R;
  count_ = std::size_t(tokens_per_step_ * (r + 1) / R - first_);
  for (std::uint64_t q = 0; q < R; ++q)
    rows_of_rank_.push_back(std::uint32_t(tokens_per_step_ * (q + 1) / R - tokens_per_step_ * q / R));
  layer_rows_of_rank_.resize(std::size_t(R));
  routing_.resize(shape_.layers);
  setup_.transport = &transport_;
  setup_.topology = &topology_;
  setup_.store = &store_;
  setup_.executor = executor_.get();
  setup_.hierarchical = config.comm.hierarchical && topology.islands() > 1;
  setup_.overlap = config.engine.overlap;
  setup_.narrow_answers = config.comm.narrow_answers;
  setup_.any_rows_per_call = config.experts.gemm == Gemm::fixed_order;
  setup_.split_rows = std::size_t(config.engine.split_rows);
  setup_.poll = [this] {
    for (LayerPass& pass : passes_) pass.poll();
  };
  const std::size_t M = std::size_t(config.engine.microbatches);
  counts_.assign(M, ExpertCounts(transport.size(), shape_.experts));
  homes_.resize(M);
  passes_.resize(M);
}

void Engine::record_stats_into(routing::RoutingStats* stats, std::size_t follow_tokens) {
  stats_ = stats;
  paths_.reset();
  if (stats && !workload_)
    paths_.emplace(shape_.layers, int(std::max(config_.model.top_k, config_.router.max_k)), follow_tokens);
}

StepRecord Engine::open_step() {
  StepRecord rec;
  rec.expert_load.assign(std::size_t(shape_.layers) * shape_.experts, 0);
  rec.tokens_per_layer.assign(std::size_t(shape_.layers), 0);
  start_rank_figures(rec);
  step_start_ = now_seconds();
  executor_->clear_counts();
  executor_->begin_step();
  shared_executor_->begin_step();
  return rec;
}

void Engine::close_step(StepRecord& rec) {
  route_.policies().end_step();
  rec.bytes_copied += executor_->bytes_copied();
  rec.trace = tracer_.take();
  rec.total = now_seconds() - step_start_;
}

StepRecord Engine::run_step(std::uint64_t step, std::vector<float>& x) {
  MOED_CHECK(workload_, "run_step without a workload");
  StepRecord rec = open_step();
  x.resize(count_ * shape_.hidden);
  fetch_tokens(step, x.data());
  tags_.clear();
  for (std::uint64_t id : ids_) tags_.push_back(request_of_token(id, tokens_per_step_, positions_per_request_));
  // The model's layers in order: its MoE layers, and its dense layers where moed serves them.
  const bool numbered = !shape_.spec.moe_layers.empty();  // else a bare shape: every layer an MoE layer
  const int model_layers = numbered ? shape_.spec.model_layers : shape_.layers;
  for (int m = 0, l = 0, dense = 0; m < model_layers; ++m) {
    if (!numbered || shape_.spec.moe_index(m) >= 0)
      run_layer(l++, step, x.data(), count_, step * tokens_per_step_ + first_, tags_, rows_of_rank_, rec);
    else if (dense < store_.dense_layers() && store_.dense_model_layer(dense) == m)
      run_dense_layer(dense++, x.data(), count_, rec);
  }
  if (stats_) record_stats();
  close_step(rec);
  return rec;
}

std::vector<std::uint32_t> Engine::agree_layer_counts(const std::vector<LayerRows>& mine, std::uint64_t step) {
  const std::size_t L = std::size_t(served_layers());
  std::vector<std::uint32_t> local(L, 0), all(L * std::size_t(transport_.size()));
  for (std::size_t l = 0; l < std::min(L, mine.size()); ++l) local[l] = std::uint32_t(mine[l].rows);
  transport_.all_gather(local.data(), L * sizeof(std::uint32_t), all.data(),
                        fmt::format("rows per layer of step {}", step));
  return all;
}

StepRecord Engine::run_layers(std::uint64_t step, std::vector<LayerRows>& layers,
                              const std::vector<std::uint32_t>& counts) {
  const std::size_t L = std::size_t(served_layers()), R = std::size_t(transport_.size()),
                    me = std::size_t(transport_.rank()), moe = std::size_t(shape_.layers);
  MOED_CHECK(layers.size() == L && counts.size() == L * R, "run_layers: {} layers, {} counts", layers.size(),
             counts.size());
  StepRecord rec = open_step();
  for (std::size_t l = 0; l < L; ++l) {
    std::uint64_t total = 0, before = 0;
    for (std::size_t r = 0; r < R; ++r) {
      layer_rows_of_rank_[r] = counts[r * L + l];
      total += counts[r * L + l];
      if (r < me) before += counts[r * L + l];
    }
    if (total == 0) continue;  // no rank has rows for this layer: no collective either
    LayerRows& in = layers[l];
    if (l >= moe) {  // a dense layer: this rank's rows alone, no collective
      if (in.rows) run_dense_layer(int(l - moe), in.x, in.rows, rec);
      continue;
    }
    tags_.resize(in.rows);
    for (std::size_t t = 0; t < in.rows; ++t)
      tags_[t] = {in.request_ids ? in.request_ids[t] : 0, in.positions ? in.positions[t] : 0u};
    run_layer(int(l), step, in.x, in.rows, before, tags_, layer_rows_of_rank_, rec);
    if (paths_)
      for (std::size_t t = 0; t < in.rows; ++t)
        paths_->observe(in.request_ids[t], in.positions[t], int(l), routing_[l].experts_of(t), *stats_);
  }
  close_step(rec);
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

void Engine::run_layer(int layer, std::uint64_t step, float* x, std::size_t count, std::uint64_t first_position,
                       std::span<const TokenTag> tags, std::span<const std::uint32_t> rows_of_rank,
                       StepRecord& rec) {
  const std::string where = fmt::format("step {} layer {}", step, shape_.spec.model_layer(layer));
  tracer_.select(tags);
  shared_s_ = 0;
  LayerTimes times;
  times.start = now_seconds();

  // route: normalise, then the router (or the workload's replayed routing) picks experts.
  Routing& routing = routing_[layer];
  routing.clear();
  const bool replayed = workload_ && workload_->replays_routing();
  if (replayed) fetch_routing(layer, routing);
  route_.run({layer, x, count, tags, rows_of_rank, &where}, replayed, routing, rec);
  times.routed = now_seconds();

  // plan: one all-gather tells every rank every pass's counts, so each rank
  // plans its sends and sizes its receives.
  take_census(routing, count, first_position, where);
  times.synced = now_seconds();
  plan_passes(layer, step, count, first_position, where, times.synced);
  times.planned = now_seconds();

  // Every pass's rows leave at once; then whatever has landed is worked on.
  for (LayerPass& pass : passes_) pass.start();
  times.sent = now_seconds();
  // While the rows travel: the shared expert needs none of them.
  if (store_.has_shared()) run_shared_expert(layer, step, count, rec);
  double rows_wait = 0, answers_wait = 0;
  drive_passes(rows_wait, answers_wait);
  kernels::residual_from_fixed(x, acc_.data(), count * std::size_t(shape_.hidden), x);
  times.combined = now_seconds();
  tracer_.record_home({layer, transport_.rank(), topology_.island_of(transport_.rank()), step, placement_.epoch(),
                       first_position, &routing},
                      times);
  account_layer(layer, step, count, times, rows_wait, answers_wait, rec);
}

template <class Weight>
ExpertCallCounts Engine::run_held(const kernels::ExpertView& ffn, const float* xn, std::size_t count,
                                  StepRecord& rec, Weight&& weight, const std::function<void()>& between_blocks) {
  const std::size_t H = std::size_t(shape_.hidden);
  shared_rows_.resize(count);
  for (std::size_t t = 0; t < count; ++t)
    shared_rows_[t] = {xn + t * H, reinterpret_cast<std::byte*>(acc_.data() + t * H), weight(t), false};
  const ExpertCallCounts counts = shared_executor_->run(ffn, shared_rows_, between_blocks);
  rec.saturated += counts.saturated;
  return counts;
}

void Engine::run_shared_expert(int layer, std::uint64_t step, std::size_t count, StepRecord& rec) {
  const double start = now_seconds();
  const std::size_t H = std::size_t(shape_.hidden);
  const float* xn = route_.normalised();
  const std::vector<float>& gate = store_.layer(layer).shared_gate;  // Qwen2-MoE's, else empty
  const ExpertCallCounts counts = run_held(store_.shared_expert(layer), xn, count, rec, [&](std::size_t t) {
    if (gate.empty()) return 1.0f;
    double logit = 0;  // one chain in index order: a row's weight depends on the row alone
    for (std::size_t i = 0; i < H; ++i) logit += double(gate[i]) * double(xn[t * H + i]);
    return float(1 / (1 + std::exp(-logit)));
  }, setup_.poll);  // the rows in flight keep moving
  // Its NaN or inf terms poison their tokens' outputs like a routed expert's;
  // it is no placed expert, so it is logged (once per layer) but not counted per expert.
  if (counts.nonfinite) {
    if (warned_shared_.empty()) warned_shared_.assign(std::size_t(shape_.layers), 0);
    if (!std::exchange(warned_shared_[std::size_t(layer)], 1))
      spdlog::warn("step {} layer {}: {} output terms of the shared expert are NaN or inf; those elements of the "
                   "tokens' outputs are NaN. Logged once per layer", step, shape_.spec.model_layer(layer),
                   counts.nonfinite);
  }
  shared_s_ = now_seconds() - start;
  rec.shared += shared_s_;
}

void Engine::run_dense_layer(int d, float* x, std::size_t count, StepRecord& rec) {
  const double start = now_seconds();
  const std::size_t H = std::size_t(shape_.hidden);
  dense_xn_.resize(count * H);
  kernels::rms_norm(x, store_.dense_norm(d).data(), count, int(H), float(config_.model.norm_eps), dense_xn_.data());
  acc_.assign(count * H, 0);
  const ExpertCallCounts counts =
      run_held(store_.dense_ffn(d), dense_xn_.data(), count, rec, [](std::size_t) { return 1.0f; }, {});
  if (counts.nonfinite && !std::exchange(warned_dense_, true))
    spdlog::warn("model layer {} (dense): {} output terms are NaN or inf; those elements of the tokens' outputs are "
                 "NaN. Logged once", store_.dense_model_layer(d), counts.nonfinite);
  kernels::residual_from_fixed(x, acc_.data(), count * H, x);
  rec.shared += now_seconds() - start;
}

void Engine::take_census(const Routing& routing, std::size_t count, std::uint64_t first_position,
                         const std::string& where) {
  for (std::size_t m = 0; m < passes_.size(); ++m) {
    const auto [first, n] = pass_rows(m, count);
    tracer_.announce(first, n, census_.write(m, routing, first, n, first_position + first));
  }
  census_.gather(transport_, "expert counts of " + where);
}

void Engine::plan_passes(int layer, std::uint64_t step, std::size_t count, std::uint64_t first_position,
                         const std::string& where, double sync_s) {
  const std::size_t M = passes_.size();
  acc_.assign(count * std::size_t(shape_.hidden), 0);
  for (std::size_t m = 0; m < M; ++m) {
    census_.read(m, counts_[m], homes_[m]);
    const auto [first, n] = pass_rows(m, count);
    PlanInput in{&routing_[layer], &placement_, layer, &counts_[m], transport_.rank(),
                 std::uint64_t(config_.experts.chunk_rows), step, &topology_, setup_.hierarchical, first_position,
                 first, n, setup_.any_rows_per_call};
    passes_[m].plan(setup_, in, homes_[m], route_.normalised(), acc_.data(),
                    M == 1 ? where : fmt::format("{} micro-batch {}", where, m));
  }
  for (std::size_t m = 0; m < M; ++m)
    passes_[m].observe(tracer_.observe_pass(m, census_, layer, transport_.rank(), topology_, sync_s));
}

void Engine::account_layer(int layer, std::uint64_t step, std::size_t count, const LayerTimes& times,
                           double rows_wait, double answers_wait, StepRecord& rec) {
  const int E = shape_.experts, R = transport_.size();
  const std::size_t M = passes_.size();
  double experts = 0;
  for (const LayerPass& pass : passes_) {
    const PassCounters& c = pass.counters();
    experts += c.experts_s;
    for (int k = 0; k < placement::kLinkClasses; ++k) rec.bytes_sent[k] += c.bytes_sent[k];
    rec.bytes_copied += c.bytes_copied;
    rec.saturated += c.saturated;
    for (const auto& [expert, terms] : c.nonfinite) note_nonfinite(layer, expert, terms, step, rec);
  }
  rec.route += times.routed - times.start;
  rec.plan += times.planned - times.routed;
  rec.experts += experts;
  rec.rows_wait += rows_wait;
  rec.answers_wait += answers_wait;
  rec.other += (times.combined - times.planned) - experts - shared_s_ - rows_wait - answers_wait;
  rec.rows_wait_per_layer.push_back(rows_wait);
  rec.answers_wait_per_layer.push_back(answers_wait);
  rec.token_layers += count;
  rec.tokens_per_layer[std::size_t(layer)] += count;
  for (int e = 0; e < E; ++e) {
    std::uint64_t load = 0;
    for (std::size_t m = 0; m < M; ++m) load += counts_[m].total(e);
    rec.expert_load[std::size_t(layer) * E + e] = load;
    rec.pairs += load;
  }
  if (!rec.routed_rows_by_rank.empty()) {
    const std::size_t L = std::size_t(shape_.layers);
    for (int r = 0; r < R; ++r) {
      const std::size_t row = std::size_t(r) * L + std::size_t(layer);
      for (std::size_t m = 0; m < M; ++m) {
        rec.routed_rows_by_rank[row] += homes_[m].tokens[std::size_t(r)];
        for (int e = 0; e < E; ++e) rec.routed_load_by_rank[row * std::size_t(E) + std::size_t(e)] += counts_[m].at(r, e);
      }
    }
  }
  // The counts are the all-gathered ones: every rank updates its biases alike.
  route_.policies().end_layer(layer, std::span(rec.expert_load).subspan(std::size_t(layer) * E, std::size_t(E)));
}

// Rank 0 keeps every rank's routing figures of the step (the others leave
// them empty): the census already holds them, so this costs no message.
void Engine::start_rank_figures(StepRecord& rec) const {
  if (transport_.rank() != 0) return;
  const std::size_t cells = std::size_t(transport_.size()) * std::size_t(shape_.layers);
  rec.routed_rows_by_rank.assign(cells, 0);
  rec.routed_load_by_rank.assign(cells * std::size_t(shape_.experts), 0);
}

// Counted for the report; logged the first time per expert, on the rank
// that computed it (a bad expert would otherwise log every step).
void Engine::note_nonfinite(int layer, int expert, std::uint64_t terms, std::uint64_t step, StepRecord& rec) {
  const std::size_t key = std::size_t(layer) * std::size_t(shape_.experts) + std::size_t(expert);
  rec.add_nonfinite(std::uint32_t(key), terms);
  if (warned_nonfinite_.empty()) warned_nonfinite_.assign(std::size_t(shape_.layers) * shape_.experts, 0);
  if (std::exchange(warned_nonfinite_[key], 1)) return;
  spdlog::warn("step {} layer {} expert {}: {} output terms are NaN or inf (in the weights, or in the tokens' "
               "rows); those elements of the tokens' outputs are NaN. Counted per expert in the report "
               "(moed_nonfinite_terms_total); logged once per expert",
               step, layer, expert, terms);
}

void Engine::drive_passes(double& rows_wait, double& answers_wait) {
  comm::IdleBackoff backoff;
  double idle_since = -1;
  bool idle_for_rows = false;
  for (;;) {
    // An idle spell ends where the poll that found work began: the work it
    // then did (an expert call, say) is not waiting.
    const double polled_at = idle_since >= 0 ? now_seconds() : 0;
    bool all_done = true, moved = false, rows_due = false;
    for (LayerPass& pass : passes_) {
      if (pass.done()) continue;
      if (pass.advance()) moved = true;
      if (!pass.done()) all_done = false;
      rows_due = rows_due || pass.awaiting_rows();
    }
    if (moved || all_done) {
      if (idle_since >= 0) (idle_for_rows ? rows_wait : answers_wait) += polled_at - idle_since;
      idle_since = -1;
      backoff.reset();
      if (all_done) break;
      continue;
    }
    if (idle_since < 0) idle_since = now_seconds(), idle_for_rows = rows_due;
    // Each exchange keeps its own deadline; this one catches a pass that
    // waits for nothing any exchange still owes (a bug, never a silent hang).
    if (now_seconds() - idle_since > double(config_.comm.timeout_ms) / 1e3) {
      std::string state;
      for (const LayerPass& pass : passes_)
        if (!pass.done()) state += "\n  " + pass.describe();
      MOED_THROW(Internal, "rank {}: a layer made no progress for {} ms ([comm].timeout_ms):{}", transport_.rank(),
                 config_.comm.timeout_ms, state);
    }
    backoff.idle();
  }
  for (LayerPass& pass : passes_) pass.finish();
}

void Engine::abandon_step() {
  for (LayerPass& pass : passes_) pass.abandon();
}

}  // namespace moed::runtime
