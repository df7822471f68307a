// The engine's tracing: which of a layer's rows are traced, their slots in
// the census (census.h), and what this rank records of the traced tokens
// (runtime/trace/trace_records.h). LayerTracer picks the rows and writes the
// home's records; a PassTracer per pass is the pass's observer
// (pass_observer.h): on the home, a leg per rank the token's row goes to and
// when its answer came back; on the ranks that compute, a visit per expert,
// when its row arrived, ran and was answered. Untraced, the engine keeps no
// observer on its passes: they do no trace work.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <utility>
#include <vector>

#include "placement/topology.h"
#include "runtime/engine/census.h"
#include "runtime/engine/pass_observer.h"
#include "runtime/router/router.h"
#include "runtime/trace/token_identity.h"
#include "runtime/trace/trace_records.h"
#include "runtime/trace/trace_selector.h"

namespace moed::runtime {

// The moments of one layer on this rank (now_seconds()).
struct LayerTimes {
  double start = 0;     // the route stage began
  double routed = 0;    // the rows' experts are chosen
  double synced = 0;    // the census is in: the layer's sync point
  double planned = 0;   // every pass is planned
  double sent = 0;      // every pass's rows have left
  double combined = 0;  // the sums and the residual are done
};

class PassTracer final : public PassObserver {
 public:
  // A new layer's pass on rank `me`, tracing nothing yet: times count in
  // microseconds from `origin_s` (the layer's sync point), records go to `out`.
  void start(int layer, int me, const placement::Topology& topology, double origin_s, trace::TraceFragments& out);
  // A token the pass traces, announced in the census by its home.
  void add(int home, std::uint64_t key) { keys_.emplace_back(home, key); }
  bool empty() const { return keys_.empty(); }
  bool traced(int home, std::uint64_t key) const;

  void planned(const DispatchPlan& plan, AnswerFormat format) override;
  void rows_arrived(PassStream stream, int source, const ReceivedRows::Source& rows) override;
  void expert_ran(int expert, std::span<const ExpertRow> rows, double start_s, double end_s) override;
  void answers_sent(PassStream stream, int source) override;
  void answers_back(PassStream stream, int source, const RowBatch& sent, const std::byte* block,
                    std::size_t bytes) override;

 private:
  float us_since_origin(double seconds) const { return float((seconds - origin_s_) * 1e6); }
  trace::TraceKey key_of(int home, std::uint64_t key) const { return {key, home, layer_}; }
  // The home of a traced token (keys are step-wide positions: no two homes
  // share one); -1 when the token is not traced.
  int home_of(std::uint64_t key) const;

  int layer_ = 0, me_ = 0;
  const placement::Topology* topology_ = nullptr;
  double origin_s_ = 0;
  trace::TraceFragments* out_ = nullptr;
  AnswerFormat format_{0};
  std::vector<std::pair<int, std::uint64_t>> keys_;  // (home, key): every rank's traced tokens
  // This rank's visits (their row, to find them in an expert call) and the
  // home's legs, each with the stream and rank its answer goes to or comes from.
  struct Visit {
    std::size_t record;
    PassStream stream;
    int source;
    std::uint32_t expert;
    const float* row;
  };
  struct Leg {
    std::size_t record;
    PassStream stream;
    int rank;
  };
  std::vector<Visit> visits_;
  std::vector<Leg> legs_;
  std::vector<std::uint32_t> row_bytes_;  // an answer message's rows, as they came
};

class LayerTracer {
 public:
  // For a layer of `passes` passes (their tracers stay where they are: the
  // passes hold them).
  explicit LayerTracer(std::size_t passes) : passes_(passes) {}
  // Traces the tokens `selector` wants (none: nullptr); the selector must
  // decide alike on every rank.
  void trace_with(const trace::TraceSelector* selector) { selector_ = selector; }

  // Picks the traced rows among a layer's rows (tags: their requests, by local row).
  void select(std::span<const TokenTag> tags);
  // Writes the traced rows among [first, first + n) into a pass's census
  // slots: their offsets in the pass, the first kTraceSlots of them.
  void announce(std::size_t first, std::size_t n, std::span<std::uint32_t> slots) const;
  // After the census: every rank's traced tokens in pass m. Returns the
  // pass's observer, or nullptr when the pass traces nothing.
  PassObserver* observe_pass(std::size_t m, const LayerCensus& census, int layer, int me,
                             const placement::Topology& topology, double sync_s);
  // The home's records of its traced rows in the layer (those that had a
  // slot in the census): its routing and the layer's moments on this rank.
  struct Home {
    int layer = 0, rank = 0, island = 0;
    std::uint64_t step = 0, epoch = 0, first_position = 0;
    const Routing* routing = nullptr;
  };
  void record_home(const Home& home, const LayerTimes& times);
  // This step's records; the next step starts with none.
  trace::TraceFragments take();

 private:
  const trace::TraceSelector* selector_ = nullptr;
  std::vector<std::pair<std::uint32_t, trace::TokenIdentity>> rows_;  // this layer's traced rows (local row)
  std::vector<PassTracer> passes_;
  trace::TraceFragments fragments_;  // this step's records
};

}  // namespace moed::runtime
