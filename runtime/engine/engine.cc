#include "runtime/engine/engine.h"

#include <algorithm>
#include <utility>

#include "comm/idle_backoff.h"
#include "common/clock.h"
#include "common/error.h"
#include "common/log.h"
#include "kernels/cpu/fixed_combine.h"

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
      tokens_per_step_(std::uint64_t(config.workload.tokens_per_step)),
      order_(tokens_per_step_, config.workload.order == "shuffled", std::uint64_t(config.workload.seed)),
      route_(config, transport, placement, store),
      positions_per_request_(std::uint64_t(config.workload.positions_per_request)) {
  const std::uint64_t R = std::uint64_t(transport.size()), r = std::uint64_t(transport.rank());
  first_ = tokens_per_step_ * r / R;
  count_ = std::size_t(tokens_per_step_ * (r + 1) / R - first_);
  for (std::uint64_t q = 0; q < R; ++q)
    rows_of_rank_.push_back(std::uint32_t(tokens_per_step_ * (q + 1) / R - tokens_per_step_ * q / R));
  hierarchical_ = config.comm.hierarchical && topology.islands() > 1;
  microbatches_ = std::size_t(config.engine.microbatches);
  routing_.resize(shape_.layers);
  setup_.transport = &transport_;
  setup_.topology = &topology_;
  setup_.store = &store_;
  setup_.executor = &executor_;
  setup_.hierarchical = hierarchical_;
  setup_.overlap = config.engine.overlap;
  setup_.narrow_answers = config.comm.narrow_answers;
  setup_.any_rows_per_call = config.experts.gemm == "fixed-order";
  setup_.split_rows = std::size_t(config.engine.split_rows);
  setup_.poll = [this] {
    for (LayerPass& pass : passes_) pass.poll();
  };
  counts_.assign(microbatches_, ExpertCounts(transport.size(), shape_.experts));
  homes_.resize(microbatches_);
  passes_.resize(microbatches_);
}

void Engine::record_stats_into(routing::RoutingStats* stats, std::size_t follow_tokens) {
  stats_ = stats;
  paths_.reset();
  if (stats && !workload_)
    paths_.emplace(shape_.layers, int(std::max(config_.model.top_k, config_.router.max_k)), follow_tokens);
}

StepRecord Engine::run_step(std::uint64_t step, std::vector<float>& x) {
  MOED_CHECK(workload_, "run_step without a workload");
  StepRecord rec;
  rec.expert_load.assign(std::size_t(shape_.layers) * shape_.experts, 0);
  rec.tokens_per_layer.assign(std::size_t(shape_.layers), 0);
  start_rank_figures(rec);
  const double start = now_seconds();
  executor_.clear_counts();
  x.resize(count_ * shape_.hidden);
  fetch_tokens(step, x.data());
  tags_.clear();
  for (std::uint64_t id : ids_) tags_.push_back(request_of_token(id, tokens_per_step_, positions_per_request_));
  // A workload token is traced through every layer of its step.
  select_traced(count_, [&](std::size_t t) { return trace::identity_of(tags_[t]); });
  for (int l = 0; l < shape_.layers; ++l)
    run_layer(l, step, x.data(), count_, step * tokens_per_step_ + first_, tags_, rows_of_rank_, rec);
  route_.policies().end_step();
  if (stats_) record_stats();
  rec.bytes_copied += executor_.bytes_copied();
  rec.trace = std::move(fragments_);
  fragments_.clear();
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
  rec.tokens_per_layer.assign(L, 0);
  start_rank_figures(rec);
  const double start = now_seconds();
  executor_.clear_counts();
  std::vector<std::uint32_t> rows_of_rank(R);
  for (std::size_t l = 0; l < L; ++l) {
    std::uint64_t total = 0, before = 0;
    for (std::size_t r = 0; r < R; ++r) {
      rows_of_rank[r] = counts[r * L + l];
      total += counts[r * L + l];
      if (r < me) before += counts[r * L + l];
    }
    if (total == 0) continue;  // no rank has rows for this layer: no collective either
    LayerRows& in = layers[l];
    tags_.resize(in.rows);
    for (std::size_t t = 0; t < in.rows; ++t)
      tags_[t] = {in.request_ids ? in.request_ids[t] : 0, in.positions ? in.positions[t] : 0u};
    select_traced(in.rows, [&](std::size_t t) { return trace::identity_of(tags_[t]); });
    run_layer(int(l), step, in.x, in.rows, before, tags_, rows_of_rank, rec);
    if (paths_)
      for (std::size_t t = 0; t < in.rows; ++t)
        paths_->observe(in.request_ids[t], in.positions[t], int(l), routing_[l].experts_of(t), *stats_);
  }
  route_.policies().end_step();
  rec.bytes_copied += executor_.bytes_copied();
  rec.trace = std::move(fragments_);
  fragments_.clear();
  rec.total = now_seconds() - start;
  return rec;
}

void Engine::select_traced(std::size_t count, const std::function<trace::TokenIdentity(std::size_t)>& identity) {
  traced_rows_.clear();
  if (!selector_ || selector_->idle()) return;
  for (std::size_t t = 0; t < count; ++t)
    if (const trace::TokenIdentity id = identity(t); selector_->wants(id.request_id))
      traced_rows_.emplace_back(std::uint32_t(t), id);
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

// The all-gather of a layer: per rank, per pass, the pass's counts per
// expert, then its token count and first token key (two words).
// Then, per pass, the rows it traces (trace::kTraceSlots words, offsets in
// the pass or kNoTrace): every rank learns which tokens are traced from the
// collective it runs anyway.
namespace {
constexpr std::size_t kCensusExtra = 3 + trace::kTraceSlots;
}

void Engine::run_layer(int layer, std::uint64_t step, float* x, std::size_t count, std::uint64_t first_position,
                       std::span<const TokenTag> tags, std::span<const std::uint32_t> rows_of_rank,
                       StepRecord& rec) {
  const int H = shape_.hidden, E = shape_.experts, R = transport_.size();
  const std::size_t M = microbatches_, W = std::size_t(E) + kCensusExtra;
  const std::string where = fmt::format("step {} layer {}", step, layer);
  const double t0 = now_seconds();

  // route: normalise, then the router (or the workload's replayed routing) picks experts.
  Routing& routing = routing_[layer];
  routing.clear();
  const bool replayed = workload_ && workload_->replays_routing();
  if (replayed) fetch_routing(layer, routing);
  route_.run({layer, x, count, tags, rows_of_rank, &where}, replayed, routing, rec);
  const double t1 = now_seconds();

  // plan: one all-gather tells every rank every pass's counts, so each rank
  // plans its sends and sizes its receives.
  std::vector<std::uint32_t> mine(M * W);
  const auto pass_rows = [&](std::size_t m) { return std::pair{count * m / M, count * (m + 1) / M - count * m / M}; };
  for (std::size_t m = 0; m < M; ++m) {
    const auto [first, n] = pass_rows(m);
    const std::vector<std::uint32_t> c = ExpertCounts::local(routing, E, first, n);
    std::copy(c.begin(), c.end(), mine.begin() + std::ptrdiff_t(m * W));
    const std::uint64_t key = first_position + first;
    mine[m * W + E] = std::uint32_t(n);
    mine[m * W + E + 1] = std::uint32_t(key);
    mine[m * W + E + 2] = std::uint32_t(key >> 32);
    std::uint32_t* slots = mine.data() + m * W + E + 3;
    std::fill(slots, slots + trace::kTraceSlots, trace::kNoTrace);
    std::size_t used = 0;
    for (const auto& [row, id] : traced_rows_)
      if (row >= first && row < first + n && used < trace::kTraceSlots) slots[used++] = std::uint32_t(row - first);
  }
  census_.resize(std::size_t(R) * M * W);
  transport_.all_gather(mine.data(), mine.size() * sizeof(std::uint32_t), census_.data(),
                        "expert counts of " + where);
  const double sync = now_seconds();
  acc_.assign(count * H, 0);
  for (std::size_t m = 0; m < M; ++m) {
    LayerPass::Homes& homes = homes_[m];
    homes.first_key.resize(std::size_t(R));
    homes.tokens.resize(std::size_t(R));
    for (int r = 0; r < R; ++r) {
      const std::uint32_t* block = census_.data() + (std::size_t(r) * M + m) * W;
      std::copy(block, block + E, counts_[m].data() + std::size_t(r) * E);
      homes.tokens[r] = block[E];
      homes.first_key[r] = std::uint64_t(block[E + 1]) | (std::uint64_t(block[E + 2]) << 32);
    }
    const auto [first, n] = pass_rows(m);
    PlanInput in{&routing, &placement_, layer, &counts_[m], transport_.rank(),
                 std::uint64_t(config_.experts.chunk_rows), step, &topology_, hierarchical_, first_position,
                 first, n};
    passes_[m].plan(setup_, in, homes, route_.normalised(), acc_.data(),
                    M == 1 ? where : fmt::format("{} micro-batch {}", where, m));
  }
  pass_traces_.resize(M);
  bool traced = false;
  for (std::size_t m = 0; m < M; ++m) {
    pass_traces_[m].layer = layer;
    prepare_pass_trace(m, W, E, sync);
    traced = traced || !pass_traces_[m].keys.empty();
    passes_[m].set_trace(pass_traces_[m].keys.empty() ? nullptr : &pass_traces_[m]);
  }
  const double t2 = now_seconds();

  // Every pass's rows leave at once; then whatever has landed is worked on.
  for (std::size_t m = 0; m < M; ++m) passes_[m].start();
  const double sent = now_seconds();
  double rows_wait = 0, answers_wait = 0;
  drive_passes(M, rows_wait, answers_wait);
  kernels::residual_from_fixed(x, acc_.data(), count * H, x);
  const double t3 = now_seconds();
  if (traced) record_home(layer, step, first_position, routing, t0, t1, sync, t2, sent, t3);

  double experts = 0;
  for (std::size_t m = 0; m < M; ++m) {
    const PassCounters& c = passes_[m].counters();
    experts += c.experts_s;
    for (int k = 0; k < placement::kLinkClasses; ++k) rec.bytes_sent[k] += c.bytes_sent[k];
    rec.bytes_copied += c.bytes_copied;
    rec.saturated += c.saturated;
    for (const auto& [expert, terms] : c.nonfinite) note_nonfinite(layer, expert, terms, step, rec);
  }
  rec.route += t1 - t0;
  rec.plan += t2 - t1;
  rec.experts += experts;
  rec.rows_wait += rows_wait;
  rec.answers_wait += answers_wait;
  rec.other += (t3 - t2) - experts - rows_wait - answers_wait;
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

void Engine::prepare_pass_trace(std::size_t m, std::size_t W, int E, double sync_s) {
  trace::PassTrace& pt = pass_traces_[m];
  pt.keys.clear();
  pt.visit_streams.clear();
  pt.leg_streams.clear();
  pt.origin_s = sync_s;
  pt.out = &fragments_;
  const std::size_t M = microbatches_;
  for (int r = 0; r < transport_.size(); ++r) {
    const std::uint32_t* block = census_.data() + (std::size_t(r) * M + m) * W;
    const std::uint64_t first_key = std::uint64_t(block[E + 1]) | (std::uint64_t(block[E + 2]) << 32);
    for (std::size_t i = 0; i < trace::kTraceSlots; ++i)
      if (block[E + 3 + i] != trace::kNoTrace) pt.keys.emplace_back(r, first_key + block[E + 3 + i]);
  }
}

// The home's records of its traced rows in this layer (those that had a slot
// in the census).
void Engine::record_home(int layer, std::uint64_t step, std::uint64_t first_position, const Routing& routing,
                         double t0, double t1, double sync, double t2, double sent, double t3) {
  const int me = transport_.rank();
  const auto us = [](double seconds) { return float(seconds * 1e6); };
  for (const auto& [row, id] : traced_rows_) {
    const std::uint64_t key = first_position + row;
    const trace::TraceKey at{key, me, layer};
    bool announced = false;
    for (const trace::PassTrace& pt : pass_traces_) announced = announced || pt.traced(me, key);
    if (!announced) continue;
    trace::HomeRecord h;
    h.at = at;
    h.request_id = id.request_id;
    h.position = id.position;
    h.step = step;
    h.epoch = placement_.epoch();
    h.island = topology_.island_of(me);
    h.sync_s = sync;
    h.route_us = us(t1 - t0);
    h.gather_us = us(sync - t1);
    h.planned_us = us(t2 - sync);
    h.sent_us = us(sent - sync);
    h.combined_us = us(t3 - sync);
    fragments_.homes.push_back(h);
    const auto experts = routing.experts_of(row);
    const auto weights = routing.weights_of(row);
    for (std::size_t k = 0; k < experts.size(); ++k) fragments_.choices.push_back({at, experts[k], weights[k]});
  }
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

void Engine::drive_passes(std::size_t passes, double& rows_wait, double& answers_wait) {
  comm::IdleBackoff backoff;
  double idle_since = -1;
  bool idle_for_rows = false;
  for (;;) {
    // An idle spell ends where the poll that found work began: the work it
    // then did (an expert call, say) is not waiting.
    const double polled_at = idle_since >= 0 ? now_seconds() : 0;
    bool all_done = true, moved = false, rows_due = false;
    for (std::size_t m = 0; m < passes; ++m) {
      LayerPass& pass = passes_[m];
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
      for (std::size_t m = 0; m < passes; ++m)
        if (!passes_[m].done()) state += "\n  " + passes_[m].describe();
      MOED_THROW(Internal, "rank {}: a layer made no progress for {} ms ([comm].timeout_ms):{}", transport_.rank(),
                 config_.comm.timeout_ms, state);
    }
    backoff.idle();
  }
  for (std::size_t m = 0; m < passes; ++m) passes_[m].finish();
}

}  // namespace moed::runtime
