// What a layer pass (layer_pass.h) tells whoever watches it: the seam that
// tracing plugs into (pass_tracer.h). A pass has no observer by default and
// then does no work for one. The events come per pass, per message and per
// expert call, never per row or per pair, so an observer costs the pass one
// virtual call per event and scans what it needs itself.
#pragma once

#include <cstddef>
#include <span>

#include "runtime/engine/dispatch_plan.h"
#include "runtime/engine/expert_executor.h"
#include "runtime/engine/wire_format.h"

namespace moed::runtime {

// A pass's streams of rows, each with the answers coming back (layer_pass.h):
// direct (home to the ranks that compute), hop 1 (home to a gateway in each
// other island) and forward (gateway to the ranks of its island).
enum class PassStream { direct = 0, hop1 = 1, forward = 2 };

class PassObserver {
 public:
  virtual ~PassObserver() = default;
  // The pass is planned: `plan` holds the rows this rank sends, whose
  // answers come back in `format`.
  virtual void planned(const DispatchPlan& plan, AnswerFormat format) = 0;
  // Rows to compute have landed by `stream` from `source` (this rank's own
  // rows too, which never travel); they stay where `rows` points until the
  // pass is done.
  virtual void rows_arrived(PassStream stream, int source, const ReceivedRows::Source& rows) = 0;
  // An expert call ran `rows` of `expert` from `start_s` to `end_s`.
  virtual void expert_ran(int expert, std::span<const ExpertRow> rows, double start_s, double end_s) = 0;
  // The answers to the rows from `source` by `stream` are complete and leave
  // (or, to this rank itself, are taken in place).
  virtual void answers_sent(PassStream stream, int source) = 0;
  // The answers to the rows this rank sent `source` by `stream` (`sent`)
  // have landed: `bytes` at `block`, as they came.
  virtual void answers_back(PassStream stream, int source, const RowBatch& sent, const std::byte* block,
                            std::size_t bytes) = 0;
};

}  // namespace moed::runtime
