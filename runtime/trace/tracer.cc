#include "runtime/trace/tracer.h"

#include <optional>

#include <fmt/format.h>

#include "runtime/admin/protocol.h"

namespace moed::runtime::trace {

void Tracer::absorb(const TraceFragments& step) {
  if (step.homes.empty()) return;
  std::vector<LayerTrace> layers = assemble(step);  // outside the lock: the admin thread never waits on it
  std::lock_guard lock(mu_);
  for (LayerTrace& l : layers) ring_.add(std::move(l));
  tokens_seen_ += layers.size();
}

void Tracer::note_too_late(std::uint64_t request_id, std::uint64_t last_step, std::uint64_t follow_step) {
  std::lock_guard lock(mu_);
  if (too_late_.size() == kLateKept) too_late_.pop_front();
  too_late_.push_back({request_id, last_step, follow_step});
}

nlohmann::json Tracer::answer(std::uint64_t request_id) const {
  std::vector<TokenTrace> tokens;
  std::size_t held = 0, capacity = 0;
  std::optional<TooLate> late;
  {
    std::lock_guard lock(mu_);
    tokens = ring_.find(request_id);
    held = ring_.size();
    capacity = ring_.capacity();
    for (const TooLate& t : too_late_)
      if (t.request_id == request_id) late = t;
  }
  if (tokens.empty() && late)
    return admin::error_body(
        admin::code::kAlreadyServed,
        fmt::format("request {} was served by step {}, before `moectl trace --follow` took effect at step {}: "
                    "follow a request of a later step",
                    request_id, late->last_step, late->follow_step));
  if (tokens.empty())
    return admin::error_body(
        admin::code::kNotFound,
        fmt::format("no trace of request {}: the last {} traced tokens (of at most {}, [trace].ring) are not of it. "
                    "Requests are traced at [trace].sample = {} by a hash of their id; trace one on purpose with "
                    "`moectl trace --follow {}` before it is served",
                    request_id, held, capacity, sample_, request_id));
  nlohmann::json list = nlohmann::json::array();
  for (const TokenTrace& t : tokens) list.push_back(token_trace_json(t, layers_, numbers_));
  return {{"request_id", request_id}, {"tokens", list}};
}

}  // namespace moed::runtime::trace
