// One layer's rows of one micro-batch on this rank, from the plan to the
// summed answers, as exchanges that progress together: the rows of every
// source are worked on as soon as they land (this rank's own rows first:
// they never travel), each source's answers leave as soon as the experts
// have finished its rows, and with hierarchical dispatch the gateway
// forwards the rows from other islands while its own island's rows are
// already being computed. Nothing waits for a size exchange: every rank
// sizes what it receives from the all-gathered counts (pairs exactly, rows
// at most one per pair or per token).
//
// The order work happens in changes nothing in the bits: a row's expert
// output does not depend on the rows it shares a call with (fixed-order
// GEMM), or the calls are whole canonical chunks (OpenBLAS); the sums are
// exact fixed point.
//
// Streams of rows, each with the answers coming back:
//   direct   home -> the ranks of its island (flat: every rank) that compute;
//   hop 1    home -> a gateway in each other island (hierarchical only);
//   forward  gateway -> the ranks of its island that compute.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "comm/transport.h"
#include "placement/topology.h"
#include "runtime/engine/census.h"
#include "runtime/engine/chunk_schedule.h"
#include "runtime/engine/dispatch_plan.h"
#include "runtime/engine/expert_executor.h"
#include "runtime/engine/pass_observer.h"
#include "runtime/engine/wire_format.h"
#include "runtime/weights/expert_store.h"

namespace moed::runtime {

// What a pass measured and moved (summed over passes into the StepRecord).
struct PassCounters {
  double experts_s = 0;  // in expert calls
  std::array<std::uint64_t, placement::kLinkClasses> bytes_sent{};
  std::uint64_t bytes_copied = 0;  // rows packed into messages (forwarded ones too), answers narrowed
  std::uint64_t saturated = 0;
  // Expert calls whose output held NaN or inf terms: (expert, terms).
  std::vector<std::pair<int, std::uint64_t>> nonfinite;
};

class LayerPass {
 public:
  struct Setup {
    comm::Transport* transport = nullptr;
    const placement::Topology* topology = nullptr;
    const ExpertStore* store = nullptr;
    ExpertExecutor* executor = nullptr;
    bool hierarchical = false;
    bool overlap = true;          // [engine].overlap
    bool narrow_answers = true;   // [comm].narrow_answers
    bool any_rows_per_call = true;  // the fixed-order GEMM: tasks may be cut and merged
    std::size_t split_rows = 256;   // [engine].split_rows
    // Between the blocks of a long expert call: take in what has landed
    // (every pass of the layer), so that transfers keep moving.
    std::function<void()> poll;
  };
  // Every rank's part of the pass (from the census): its first token key
  // and its token count.
  using Homes = PassHomes;

  // Plans the pass; `in.counts` holds the all-gathered counts. `xn` holds the
  // normalised rows and `acc` the fixed-point sums of this rank's tokens
  // (indexed like in.routing).
  void plan(const Setup& setup, const PlanInput& in, const Homes& homes, const float* xn, std::int64_t* acc,
            const std::string& where);
  // After plan(), before start(): who watches the pass (nullptr: no one,
  // the default; a new plan() drops it).
  void observe(PassObserver* observer);
  // Opens the exchanges (every rank in the same order) and sends the rows.
  void start();
  // Handles what has landed and runs one expert call if one is ready; false
  // when there was nothing to do.
  bool advance();
  bool done() const;
  // Takes in the rows and answers that have landed, without running experts
  // or sending (safe between the blocks of an expert call).
  void poll();
  // Whether rows are still due (rather than only answers).
  bool awaiting_rows() const;
  // Waits for the last sends; after done().
  void finish();
  // A lost peer cut the pass short: closes its exchanges (their receives
  // cancelled, their sends left to the transport), keeping the buffers,
  // which a peer may still be reading until Transport::continue_with().
  void abandon();
  // What the pass still waits for, for a deadline's message.
  std::string describe() const;

  const PassCounters& counters() const { return counters_; }

 private:
  enum StreamId {
    kDirect = int(PassStream::direct),
    kHop1 = int(PassStream::hop1),
    kForward = int(PassStream::forward),
    kStreams = 3
  };
  struct Stream {
    std::vector<RowBatch>* sent = nullptr;          // rows this rank sends, per rank
    std::vector<std::byte> send, recv;
    comm::ExchangeLayout layout;                    // send half exact, recv half capacities
    std::unique_ptr<comm::Exchange> rows, answers;  // rows in; answers to the rows sent
    bool rows_reported = false, answers_reported = false;  // the exchange said all arrived
    std::vector<ReceivedRows::Source> from;         // per source, once arrived
    std::vector<char> arrived;
    int awaited = 0;                                // sources not arrived
    int answers_awaited = 0;                        // answers not arrived
    std::vector<std::uint64_t> expected_pairs;      // per source, from the counts
    // Answers to the rows received (direct and forward): per source.
    std::vector<std::vector<std::byte>> answer;
    std::vector<int> tasks_left;                    // tasks to run before the answer is whole
    std::vector<char> answered;
    // Answers to the rows sent: capacities, then what landed.
    std::vector<std::byte> back;
    std::vector<std::size_t> back_bytes, back_offsets;
  };
  struct RowRef {
    const float* in;
    std::byte* out;
    float weight;
    bool single;
  };

  int me() const { return setup_.transport->rank(); }
  int ranks() const { return setup_.transport->size(); }
  bool remote_island(int rank) const;
  int home_of_key(std::uint64_t key, int stream, int source) const;
  void size_receives();
  void open(Stream& s, const char* what);
  void send_rows(Stream& s);
  template <class OnArrival>
  void drain(comm::Exchange* x, bool& all_reported, OnArrival&& on_arrival);
  void poll_rows(int id);
  void on_rows(int id, int source, ReceivedRows::Source src);
  void forward_hop1();
  bool task_ready(std::size_t task) const;
  bool run_ready_tasks();
  void send_answers();
  void on_answer(int id, int source, const std::byte* block, std::size_t bytes);
  void poll_answers(int id);
  void send_gateway_answers();

  Setup setup_;
  PlanInput in_;
  Homes homes_;
  std::int64_t* acc_ = nullptr;
  std::string where_;
  int H_ = 0;
  AnswerFormat answer_format_{0};
  DispatchPlan plan_, forward_;  // forward_.hop2: rows this gateway forwards
  ChunkSchedule schedule_;
  std::vector<std::vector<std::uint64_t>> pairs_from_;  // [home][rank]
  std::array<Stream, kStreams> streams_;
  ReceivedRows hop1_in_;
  GatewayAnswers gateway_;
  bool forwarded_ = true, gateway_answered_ = true;
  int forward_answers_awaited_ = 0;
  // Per task: done; per (slot, home): the rows arrived, in order.
  std::vector<char> task_done_;
  std::size_t tasks_left_ = 0;
  std::vector<std::vector<std::vector<RowRef>>> rows_;  // [slot][home]
  std::vector<std::vector<std::pair<int, int>>> task_sources_;  // [task]: (stream, source) pairs
  std::vector<std::pair<int, int>> home_source_;  // [home]: the (stream, source) its rows come by
  std::vector<int> slot_of_;                      // [expert]: its slot, -1 if not here
  bool moved_ = false;                            // something happened in this advance()
  std::vector<ExpertRow> call_;
  PassObserver* observer_ = nullptr;
  PassCounters counters_;
};

}  // namespace moed::runtime
