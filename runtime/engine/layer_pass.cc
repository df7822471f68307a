#include "runtime/engine/layer_pass.h"

#include <algorithm>
#include <numeric>
#include <utility>

#include "common/clock.h"
#include "common/error.h"

#include <fmt/ranges.h>

namespace moed::runtime {

namespace {

// The most bytes of row messages carrying `pairs` pairs of `tokens` tokens.
std::size_t row_capacity(std::uint64_t pairs, std::uint64_t tokens, int hidden) {
  return pairs == 0 ? 0 : row_message_bytes(std::min(pairs, tokens), pairs, hidden);
}

}  // namespace

bool LayerPass::remote_island(int rank) const {
  return setup_.hierarchical && setup_.topology->island_of(rank) != setup_.topology->island_of(me());
}

void LayerPass::plan(const Setup& setup, const PlanInput& in, const Homes& homes, const float* xn,
                     std::int64_t* acc, const std::string& where) {
  setup_ = setup;
  in_ = in;
  homes_ = homes;
  acc_ = acc;
  where_ = where;
  H_ = setup.store->shape().hidden;
  answer_format_ = AnswerFormat(H_, setup.store->ffn_chunks() == 1);
  const int R = ranks();
  plan_ = plan_dispatch(in_, xn, H_);
  forward_ = DispatchPlan{};
  forward_.hop2.resize(std::size_t(R));
  schedule_ = schedule_chunks(in_, setup.any_rows_per_call);
  pairs_from_.resize(std::size_t(R));
  for (int h = 0; h < R; ++h) pairs_from_[h] = pairs_to_ranks(in_, h);
  counters_ = PassCounters{};
  observer_ = nullptr;

  streams_[kDirect].sent = &plan_.hop2;
  streams_[kHop1].sent = &plan_.hop1;
  streams_[kForward].sent = &forward_.hop2;
  for (int id = 0; id < kStreams; ++id) {
    Stream& s = streams_[id];
    const bool active = id == kDirect || setup_.hierarchical;
    s.rows.reset();
    s.answers.reset();
    s.rows_reported = s.answers_reported = false;
    s.from.assign(std::size_t(R), {});
    s.arrived.assign(std::size_t(R), 0);
    s.awaited = active ? R : 0;
    s.answers_awaited = active ? R : 0;
    s.answer.resize(std::size_t(R));
    s.tasks_left.assign(std::size_t(R), 0);
    s.answered.assign(std::size_t(R), active && id != kHop1 ? 0 : 1);
    s.expected_pairs.assign(std::size_t(R), 0);
  }
  forwarded_ = gateway_answered_ = !setup_.hierarchical;
  size_receives();

  // Where each home's rows come from, and what each task waits for.
  home_source_.resize(std::size_t(R));
  for (int h = 0; h < R; ++h)
    home_source_[h] = remote_island(h)
                          ? std::pair{int(kForward), gateway(*setup_.topology, h, setup_.topology->island_of(me()))}
                          : std::pair{int(kDirect), h};
  slot_of_.assign(std::size_t(in_.counts->experts()), -1);
  for (std::size_t i = 0; i < schedule_.experts.size(); ++i) slot_of_[schedule_.experts[i]] = int(i);
  rows_.resize(schedule_.experts.size());
  for (std::size_t slot = 0; slot < rows_.size(); ++slot) {
    rows_[slot].resize(std::size_t(R));
    for (int h = 0; h < R; ++h) {
      rows_[slot][h].clear();
      rows_[slot][h].reserve(schedule_.rows_from[slot][h]);
    }
  }
  const std::size_t T = schedule_.tasks.size();
  task_done_.assign(T, 0);
  tasks_left_ = T;
  task_sources_.resize(T);
  for (std::size_t i = 0; i < T; ++i) {
    auto& sources = task_sources_[i];
    sources.clear();
    for (const TaskSegment& seg : schedule_.tasks[i].segments) sources.push_back(home_source_[seg.home]);
    std::sort(sources.begin(), sources.end());
    sources.erase(std::unique(sources.begin(), sources.end()), sources.end());
    for (auto [id, source] : sources) ++streams_[id].tasks_left[source];
  }
}

// Receive sizes, from the counts: pairs exactly, rows at most one per pair
// (and per token). Answers to the rows this rank sent are sized exactly.
void LayerPass::size_receives() {
  const int R = ranks(), m = me();
  const placement::Topology* topo = setup_.topology;
  const auto gateway_of = [&](int home) { return gateway(*topo, home, topo->island_of(m)); };
  for (Stream& s : streams_) {
    s.layout.recv_bytes.assign(std::size_t(R), 0);
    s.back_bytes.assign(std::size_t(R), 0);
  }
  const std::size_t answer_row_max = combine_row_bytes(2, answer_format_);
  for (int s = 0; s < R; ++s) {
    if (s == m) continue;
    if (!remote_island(s)) {  // s sends its own rows here directly
      const std::uint64_t p = pairs_from_[s][m];
      streams_[kDirect].expected_pairs[s] = p;
      streams_[kDirect].layout.recv_bytes[s] = row_capacity(p, homes_.tokens[s], H_);
    }
    if (!setup_.hierarchical) continue;
    if (remote_island(s) && gateway_of(s) == m) {  // s's rows for this island, to forward
      std::uint64_t p = 0;
      for (int d = 0; d < R; ++d)
        if (!remote_island(d)) p += pairs_from_[s][d];
      streams_[kHop1].expected_pairs[s] = p;
      streams_[kHop1].layout.recv_bytes[s] = row_capacity(p, homes_.tokens[s], H_);
    }
    if (!remote_island(s)) {
      // s forwards here the rows of the homes it is the gateway for; and this
      // rank, as a gateway, hears back from s about the rows it forwards there.
      std::uint64_t in_pairs = 0, in_tokens = 0, out_pairs = 0, out_tokens = 0;
      for (int h = 0; h < R; ++h) {
        if (!remote_island(h)) continue;
        if (gateway_of(h) == s) in_pairs += pairs_from_[h][m], in_tokens += homes_.tokens[h];
        if (gateway_of(h) == m) out_pairs += pairs_from_[h][s], out_tokens += homes_.tokens[h];
      }
      streams_[kForward].expected_pairs[s] = in_pairs;
      streams_[kForward].layout.recv_bytes[s] = row_capacity(in_pairs, in_tokens, H_);
      streams_[kForward].back_bytes[s] = std::min(out_pairs, out_tokens) * answer_row_max;
    }
  }
  streams_[kDirect].back_bytes = combine_message_bytes(plan_.hop2, answer_format_);
  streams_[kDirect].back_bytes[m] = 0;  // answered in place
  streams_[kHop1].back_bytes = combine_message_bytes(plan_.hop1, answer_format_);
  for (Stream& s : streams_) {
    s.layout.recv_offsets = comm::ExchangeLayout::prefix_offsets(s.layout.recv_bytes);
    s.recv.resize(s.layout.recv_total());
    s.back_offsets = comm::ExchangeLayout::prefix_offsets(s.back_bytes);
    s.back.resize(std::accumulate(s.back_bytes.begin(), s.back_bytes.end(), std::size_t{0}));
  }
}

void LayerPass::open(Stream& s, const char* what) {
  comm::Transport& t = *setup_.transport;
  const std::string name = fmt::format("{} of {}", what, where_);
  s.rows = t.open_exchange(s.recv.data(), s.layout.recv_bytes, s.layout.recv_offsets, name,
                           comm::ReceiveSizes::at_most);
  s.answers = t.open_exchange(s.back.data(), s.back_bytes, s.back_offsets, "answers to the " + name,
                              comm::ReceiveSizes::at_most);
}

void LayerPass::send_rows(Stream& s) {
  pack_rows(*s.sent, H_, s.send, s.layout, me());
  counters_.bytes_copied += s.layout.send_total();
  const int R = ranks();
  for (int i = 1; i < R; ++i) {
    const int d = (me() + i) % R;
    s.rows->send(d, s.send.data() + s.layout.send_offsets[d], s.layout.send_bytes[d]);
    counters_.bytes_sent[int(setup_.topology->link(me(), d))] += s.layout.send_bytes[d];
  }
}

void LayerPass::start() {
  open(streams_[kDirect], "dispatch");
  if (setup_.hierarchical) {
    open(streams_[kHop1], "dispatch hop 1");
    open(streams_[kForward], "forwarding");
    send_rows(streams_[kHop1]);  // the slow crossing first
    on_rows(kHop1, me(), {});    // never to itself
    --streams_[kHop1].answers_awaited;
  }
  send_rows(streams_[kDirect]);
  on_rows(kDirect, me(), view_rows(plan_.hop2[me()]));
}

int LayerPass::home_of_key(std::uint64_t key, int id, int source) const {
  if (id == kDirect) return source;
  for (int h = 0; h < ranks(); ++h)
    if (home_source_[h] == std::pair{id, source} && key >= homes_.first_key[h] &&
        key < homes_.first_key[h] + homes_.tokens[h])
      return h;
  MOED_THROW(Internal, "{}: rank {} forwarded token {}, whose home is none it forwards for", where_, source, key);
}

void LayerPass::on_rows(int id, int source, ReceivedRows::Source src) {
  Stream& s = streams_[id];
  MOED_CHECK(!s.arrived[source], "{}: rows from rank {} arrived twice", where_, source);
  if (source != me())
    MOED_CHECK(src.pairs == s.expected_pairs[source],
               "{}: rank {} sent {} pairs, the all-gathered counts say {} (the ranks disagree on the plan)",
               where_, source, src.pairs, s.expected_pairs[source]);
  s.arrived[source] = 1;
  --s.awaited;
  moved_ = true;
  s.from[source] = std::move(src);
  if (id == kHop1) {
    if (s.awaited == 0) forward_hop1();
    return;
  }
  // Lay out the answers to these rows, and file each pair under its expert and home.
  const ReceivedRows::Source& f = s.from[source];
  std::size_t bytes = 0;
  for (std::uint32_t r = 0; r < f.rows; ++r) bytes += combine_row_bytes(f.pairs_per_row[r], answer_format_);
  std::vector<std::byte>& answer = s.answer[source];
  answer.resize(bytes);
  lay_out_answers(answer.data(), f.pairs_per_row, f.rows, answer_format_);  // sums start at 0
  std::byte* out = answer.data();
  for (std::uint32_t r = 0; r < f.rows; ++r) {
    const std::uint32_t pairs = f.pairs_per_row[r];
    const int home = home_of_key(f.token[r], id, source);
    for (std::uint32_t p = f.first_pair[r]; p < f.first_pair[r] + pairs; ++p) {
      const std::uint32_t e = f.experts[p];
      MOED_CHECK(f.dests[p] == std::uint32_t(me()) && e < slot_of_.size() && slot_of_[e] >= 0,
                 "{}: rank {} received a row for expert {} from rank {}, which it does not compute", where_,
                 me(), e, source);
      const bool single = answer_format_.fp32(pairs);
      rows_[slot_of_[e]][home].push_back(
          {f.row(r, H_), single ? out : reinterpret_cast<std::byte*>(fixed_row_sums(out)), f.weights[p], single});
    }
    out += combine_row_bytes(pairs, answer_format_);
  }
  for (int h = 0; h < ranks(); ++h) {
    if (home_source_[h] != std::pair{id, source}) continue;
    for (std::size_t slot = 0; slot < rows_.size(); ++slot)
      MOED_CHECK(rows_[slot][h].size() == schedule_.rows_from[slot][h],
                 "{}: expert {}: rank {} received {} rows of rank {}'s tokens, its chunks hold {}", where_,
                 schedule_.experts[slot], me(), rows_[slot][h].size(), h, schedule_.rows_from[slot][h]);
  }
  if (observer_) observer_->rows_arrived(PassStream(id), source, f);
}

void LayerPass::forward_hop1() {
  ReceivedRows hop1;
  hop1.from = std::move(streams_[kHop1].from);
  plan_forward(hop1, H_, forward_);
  gateway_ = prepare_gateway_answers(hop1, answer_format_);
  streams_[kHop1].from = std::move(hop1.from);  // the forwarded rows point into it
  forwarded_ = true;
  send_rows(streams_[kForward]);
  on_rows(kForward, me(), view_rows(forward_.hop2[me()]));
}

// Takes every arrival `x` reports now, except this rank's own (its blocks
// to itself never travel); notes when the exchange says all have come.
template <class OnArrival>
void LayerPass::drain(comm::Exchange* x, bool& all_reported, OnArrival&& on_arrival) {
  if (!x || all_reported) return;
  for (;;) {
    const int source = x->next_arrival(false);
    if (source == comm::Exchange::kNoneYet) return;
    if (source == comm::Exchange::kAllArrived) {
      all_reported = true;
      return;
    }
    if (source != me()) on_arrival(source);
  }
}

void LayerPass::poll_rows(int id) {
  Stream& s = streams_[id];
  drain(s.rows.get(), s.rows_reported, [&](int source) {
    on_rows(id, source,
            parse_row_message(s.recv.data() + s.layout.recv_offsets[source], s.rows->received_bytes(source), H_,
                              source));
  });
}

bool LayerPass::task_ready(std::size_t i) const {
  if (task_done_[i]) return false;
  for (auto [id, source] : task_sources_[i])
    if (!streams_[id].arrived[source]) return false;
  return true;
}

// The next call: with whole chunks, the first ready one. With the
// fixed-order GEMM, every ready task of one expert in one call (a call
// streams the expert's weights once), taken when all of the expert's rows
// are in, or earlier when the ready ones are at least [engine].split_rows.
bool LayerPass::run_ready_tasks() {
  if (tasks_left_ == 0) return false;
  if (!setup_.overlap && (streams_[kDirect].awaited > 0 || streams_[kForward].awaited > 0)) return false;
  const std::size_t T = task_done_.size();
  std::size_t chosen = T;
  if (!setup_.any_rows_per_call) {
    for (std::size_t i = 0; i < T && chosen == T; ++i)
      if (task_ready(i)) chosen = i;
  } else {
    for (std::size_t i = 0; i < T && chosen == T;) {
      const int slot = schedule_.tasks[i].slot;
      std::size_t first_ready = T, ready_rows = 0, waiting_rows = 0, end = i;
      for (; end < T && schedule_.tasks[end].slot == slot; ++end) {
        if (task_done_[end]) continue;
        if (task_ready(end)) {
          first_ready = std::min(first_ready, end);
          ready_rows += schedule_.tasks[end].rows;
        } else {
          waiting_rows += schedule_.tasks[end].rows;
        }
      }
      if (ready_rows > 0 && (waiting_rows == 0 || ready_rows >= setup_.split_rows)) chosen = first_ready;
      i = end;
    }
  }
  if (chosen == T) return false;
  const int slot = schedule_.tasks[chosen].slot;
  call_.clear();
  for (std::size_t i = chosen; i < T && schedule_.tasks[i].slot == slot; ++i) {
    if (i != chosen && (!setup_.any_rows_per_call || !task_ready(i))) continue;
    for (const TaskSegment& seg : schedule_.tasks[i].segments)
      for (std::uint32_t k = seg.first; k < seg.first + seg.rows; ++k) {
        const RowRef& row = rows_[slot][seg.home][k];
        call_.push_back({row.in, row.out, row.weight, row.single});
      }
    task_done_[i] = 1;
    --tasks_left_;
    for (auto [id, source] : task_sources_[i]) --streams_[id].tasks_left[source];
  }
  const double t0 = now_seconds();
  const int expert = schedule_.experts[slot];
  const ExpertCallCounts counts = setup_.executor->run(setup_.store->expert(in_.layer, expert), call_, setup_.poll);
  counters_.saturated += counts.saturated;
  if (counts.nonfinite) counters_.nonfinite.emplace_back(expert, counts.nonfinite);
  const double t1 = now_seconds();
  counters_.experts_s += t1 - t0;
  if (observer_) observer_->expert_ran(expert, call_, t0, t1);
  return true;
}

void LayerPass::send_answers() {
  for (int id : {int(kDirect), int(kForward)}) {
    Stream& s = streams_[id];
    for (int source = 0; source < ranks(); ++source) {
      if (s.answered[source] || !s.arrived[source] || s.tasks_left[source] > 0) continue;
      if (!setup_.overlap && tasks_left_ > 0) continue;
      s.answered[source] = 1;
      if (observer_) observer_->answers_sent(PassStream(id), source);
      std::vector<std::byte>& answer = s.answer[source];
      if (source == me()) {  // answered in place, at full width
        on_answer(id, source, answer.data(), answer.size());
        continue;
      }
      const ReceivedRows::Source& rows = s.from[source];
      std::size_t bytes = answer.size();
      if (setup_.narrow_answers) {
        bytes = narrow_answers(answer.data(), rows.pairs_per_row, rows.rows, answer_format_);
        counters_.bytes_copied += bytes;  // rewritten in place
      }
      s.answers->send(source, answer.data(), bytes);
      counters_.bytes_sent[int(setup_.topology->link(me(), source))] += bytes;
    }
  }
}

void LayerPass::on_answer(int id, int source, const std::byte* block, std::size_t bytes) {
  Stream& s = streams_[id];
  --s.answers_awaited;
  moved_ = true;
  if (id == kForward) {
    counters_.saturated += accumulate_answer_block(forward_.hop2[source], block, bytes, answer_format_, nullptr, &gateway_,
                                                 source);
    if (s.answers_awaited == 0) send_gateway_answers();
    return;
  }
  const RowBatch& sent = id == kDirect ? plan_.hop2[source] : plan_.hop1[source];
  counters_.saturated += accumulate_answer_block(sent, block, bytes, answer_format_, acc_, nullptr, source);
  if (observer_) observer_->answers_back(PassStream(id), source, sent, block, bytes);
}

void LayerPass::poll_answers(int id) {
  Stream& s = streams_[id];
  drain(s.answers.get(), s.answers_reported, [&](int source) {
    on_answer(id, source, s.back.data() + s.back_offsets[source], s.answers->received_bytes(source));
  });
}

void LayerPass::send_gateway_answers() {
  Stream& hop1 = streams_[kHop1];
  if (setup_.narrow_answers) {
    narrow_gateway_answers(gateway_, answer_format_);
    counters_.bytes_copied += gateway_.layout.send_total();  // rewritten in place
  }
  for (int h = 0; h < ranks(); ++h) {
    if (h == me()) continue;
    const std::size_t bytes = gateway_.layout.send_bytes[h];  // one per rank: prepared from hop 1's sources
    // Empty blocks too: a transport may launch the exchange once every rank has had its send (nccl).
    hop1.answers->send(h, gateway_.send.data() + gateway_.layout.send_offsets[h], bytes);
    counters_.bytes_sent[int(setup_.topology->link(me(), h))] += bytes;
  }
  gateway_answered_ = true;
}

void LayerPass::poll() {
  if (done()) return;
  for (int id = 0; id < kStreams; ++id) poll_rows(id);
  for (int id = 0; id < kStreams; ++id) poll_answers(id);
}

bool LayerPass::advance() {
  moved_ = false;
  for (int id = 0; id < kStreams; ++id) poll_rows(id);
  if (run_ready_tasks()) moved_ = true;
  send_answers();
  for (int id = 0; id < kStreams; ++id) poll_answers(id);
  return moved_;
}

bool LayerPass::awaiting_rows() const {
  return streams_[kDirect].awaited > 0 || streams_[kHop1].awaited > 0 || streams_[kForward].awaited > 0;
}

bool LayerPass::done() const {
  if (tasks_left_ > 0 || !gateway_answered_) return false;
  for (const Stream& s : streams_) {
    if (s.awaited > 0 || s.answers_awaited > 0) return false;
    for (char a : s.answered)
      if (!a) return false;
  }
  return true;
}

std::string LayerPass::describe() const {
  static const char* names[] = {"dispatch", "hop 1", "forwarding"};
  std::string out = fmt::format("{}: {} of {} expert tasks left", where_, tasks_left_, task_done_.size());
  for (int id = 0; id < kStreams; ++id) {
    const Stream& s = streams_[id];
    std::vector<int> rows, answers, unanswered;
    for (int r = 0; r < ranks(); ++r) {
      if (!s.arrived[r] && s.awaited > 0) rows.push_back(r);
      if (!s.answered[r]) unanswered.push_back(r);
    }
    if (s.awaited == 0 && s.answers_awaited == 0 && unanswered.empty()) continue;
    out += fmt::format("; {}: rows awaited from [{}], {} answers awaited, answers not yet sent to [{}]", names[id],
                       fmt::join(rows, ", "), s.answers_awaited, fmt::join(unanswered, ", "));
  }
  if (!forwarded_) out += "; hop 1 not yet forwarded";
  if (!gateway_answered_) out += "; the gateway's answers not yet sent";
  return out;
}

void LayerPass::observe(PassObserver* observer) {
  observer_ = observer;
  if (observer_) observer_->planned(plan_, answer_format_);
}

void LayerPass::finish() {
  for (Stream& s : streams_) {
    if (s.rows) s.rows->finish();
    if (s.answers) s.answers->finish();
    s.rows.reset();
    s.answers.reset();
  }
}

void LayerPass::abandon() {
  // The receive blocks go with their exchanges: a sender that stalled
  // mid-message may still write into them (Exchange::keep_until_received).
  for (Stream& s : streams_) {
    if (s.rows) s.rows->keep_until_received(std::exchange(s.recv, {}));
    if (s.answers) s.answers->keep_until_received(std::exchange(s.back, {}));
    s.rows.reset();
    s.answers.reset();
  }
}

}  // namespace moed::runtime
