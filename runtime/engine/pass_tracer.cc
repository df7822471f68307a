#include "runtime/engine/pass_tracer.h"

#include "common/clock.h"

namespace moed::runtime {

void PassTracer::start(int layer, int me, const placement::Topology& topology, double origin_s,
                       trace::TraceFragments& out) {
  layer_ = layer;
  me_ = me;
  topology_ = &topology;
  origin_s_ = origin_s;
  out_ = &out;
  keys_.clear();
  visits_.clear();
  legs_.clear();
}

bool PassTracer::traced(int home, std::uint64_t key) const {
  for (const auto& [h, k] : keys_)
    if (h == home && k == key) return true;
  return false;
}

int PassTracer::home_of(std::uint64_t key) const {
  for (const auto& [h, k] : keys_)
    if (k == key) return h;
  return -1;
}

// The home's side of its traced tokens: a leg per rank its row goes to (its
// own rank too, where nothing travels), from the plan.
void PassTracer::planned(const DispatchPlan& plan, AnswerFormat format) {
  format_ = format;
  const std::size_t H = std::size_t(format.hidden), bytes_per_pair = sizeof(std::uint32_t) * 2 + sizeof(float);
  for (const auto& [home, key] : keys_) {
    if (home != me_) continue;
    for (const PassStream stream : {PassStream::direct, PassStream::hop1}) {
      const std::vector<RowBatch>& batches = stream == PassStream::direct ? plan.hop2 : plan.hop1;
      for (int d = 0; d < int(batches.size()); ++d) {
        const RowBatch& b = batches[std::size_t(d)];
        for (std::size_t r = 0; r < b.rows(); ++r) {
          if (b.token[r] != key) continue;
          trace::LegRecord leg;
          leg.at = key_of(home, key);
          leg.rank = d;
          leg.island = topology_->island_of(d);
          leg.pairs = b.pairs_of(r);
          leg.via_gateway = stream == PassStream::hop1;
          if (d != me_) {
            leg.row_bytes = sizeof(std::uint64_t) + sizeof(std::uint32_t) + leg.pairs * bytes_per_pair +
                            H * sizeof(float);
            // At full width in the pass's format until the answer comes (then
            // what came): with several F-chunks even one pair is a fixed-point sum.
            leg.answer_bytes = combine_row_bytes(leg.pairs, format);
          }
          legs_.push_back({out_->legs.size(), stream, d});
          out_->legs.push_back(leg);
        }
      }
    }
  }
}

// The computing rank's side: a visit per pair of a traced token's row.
void PassTracer::rows_arrived(PassStream stream, int source, const ReceivedRows::Source& rows) {
  for (std::uint32_t r = 0; r < rows.rows; ++r) {
    const int home = home_of(rows.token[r]);
    if (home < 0) continue;
    for (std::uint32_t p = rows.first_pair[r]; p < rows.first_pair[r] + rows.pairs_per_row[r]; ++p) {
      trace::VisitRecord v;
      v.at = key_of(home, rows.token[r]);
      v.rank = me_;
      v.island = topology_->island_of(me_);
      v.expert = rows.experts[p];
      v.arrived_us = us_since_origin(now_seconds());
      visits_.push_back({out_->visits.size(), stream, source, v.expert, rows.row(r, format_.hidden)});
      out_->visits.push_back(v);
    }
  }
}

// A visit's row is in an expert call of its expert by its input: a token's
// row arrives once per pass, so (expert, row) names one visit.
void PassTracer::expert_ran(int expert, std::span<const ExpertRow> rows, double start_s, double end_s) {
  for (const Visit& visit : visits_) {
    if (visit.expert != std::uint32_t(expert)) continue;
    for (const ExpertRow& row : rows) {
      if (row.in != visit.row) continue;
      trace::VisitRecord& v = out_->visits[visit.record];
      v.start_us = us_since_origin(start_s);
      v.end_us = us_since_origin(end_s);
      v.call_rows = std::uint32_t(rows.size());
      break;
    }
  }
}

void PassTracer::answers_sent(PassStream stream, int source) {
  for (const Visit& visit : visits_)
    if (visit.stream == stream && visit.source == source)
      out_->visits[visit.record].answered_us = us_since_origin(now_seconds());
}

// Also the bytes the leg's answer came in (answers narrow on the wire).
void PassTracer::answers_back(PassStream stream, int source, const RowBatch& sent, const std::byte* block,
                              std::size_t bytes) {
  bool sized = false;
  for (const Leg& leg : legs_) {
    if (leg.stream != stream || leg.rank != source) continue;
    trace::LegRecord& l = out_->legs[leg.record];
    l.back_us = us_since_origin(now_seconds());
    if (source == me_) continue;  // answered in place: no bytes
    if (!sized) {
      answer_row_bytes(sent, block, bytes, format_, source, row_bytes_);
      sized = true;
    }
    for (std::size_t r = 0; r < sent.rows() && r < row_bytes_.size(); ++r)
      if (sent.token[r] == l.at.key) l.answer_bytes = row_bytes_[r];
  }
}

void LayerTracer::select(std::span<const TokenTag> tags) {
  rows_.clear();
  if (!selector_ || selector_->idle()) return;
  for (std::size_t t = 0; t < tags.size(); ++t)
    if (const trace::TokenIdentity id = trace::identity_of(tags[t]); selector_->wants(id.request_id))
      rows_.emplace_back(std::uint32_t(t), id);
}

void LayerTracer::announce(std::size_t first, std::size_t n, std::span<std::uint32_t> slots) const {
  std::size_t used = 0;
  for (const auto& [row, id] : rows_)
    if (row >= first && row < first + n && used < slots.size()) slots[used++] = std::uint32_t(row - first);
}

PassObserver* LayerTracer::observe_pass(std::size_t m, const LayerCensus& census, int layer, int me,
                                        const placement::Topology& topology, double sync_s) {
  PassTracer& pass = passes_.at(m);
  pass.start(layer, me, topology, sync_s, fragments_);
  for (int r = 0; r < census.ranks(); ++r)
    for (const std::uint32_t slot : census.trace_slots(r, m))
      if (slot != kNoTrace) pass.add(r, census.first_key(r, m) + slot);
  return pass.empty() ? nullptr : &pass;
}

void LayerTracer::record_home(const Home& home, const LayerTimes& t) {
  const auto us = [](double seconds) { return float(seconds * 1e6); };
  for (const auto& [row, id] : rows_) {
    const std::uint64_t key = home.first_position + row;
    bool announced = false;
    for (const PassTracer& pass : passes_) announced = announced || pass.traced(home.rank, key);
    if (!announced) continue;
    const trace::TraceKey at{key, home.rank, home.layer};
    trace::HomeRecord h;
    h.at = at;
    h.request_id = id.request_id;
    h.position = id.position;
    h.step = home.step;
    h.epoch = home.epoch;
    h.island = home.island;
    h.sync_s = t.synced;
    h.route_us = us(t.routed - t.start);
    h.gather_us = us(t.synced - t.routed);
    h.planned_us = us(t.planned - t.synced);
    h.sent_us = us(t.sent - t.synced);
    h.combined_us = us(t.combined - t.synced);
    fragments_.homes.push_back(h);
    const auto experts = home.routing->experts_of(row);
    const auto weights = home.routing->weights_of(row);
    for (std::size_t k = 0; k < experts.size(); ++k) fragments_.choices.push_back({at, experts[k], weights[k]});
  }
}

trace::TraceFragments LayerTracer::take() {
  trace::TraceFragments step = std::move(fragments_);
  fragments_.clear();
  return step;
}

}  // namespace moed::runtime
