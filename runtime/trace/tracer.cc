#include "runtime/trace/tracer.h"

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

nlohmann::json Tracer::answer(std::uint64_t request_id) const {
  std::vector<TokenTrace> tokens;
  std::size_t held = 0, capacity = 0;
  {
    std::lock_guard lock(mu_);
    tokens = ring_.find(request_id);
    held = ring_.size();
    capacity = ring_.capacity();
  }
  if (tokens.empty())
    return admin::error_body(
        admin::code::kNotFound,
        fmt::format("no trace of request {}: the last {} traced tokens (of at most {}, [trace].ring) are not of it. "
                    "Requests are traced at [trace].sample = {} by a hash of their id; trace one on purpose with "
                    "`moectl trace --follow {}` before it is served",
                    request_id, held, capacity, sample_, request_id));
  nlohmann::json list = nlohmann::json::array();
  for (const TokenTrace& t : tokens) list.push_back(token_trace_json(t, layers_));
  return {{"request_id", request_id}, {"tokens", list}};
}

}  // namespace moed::runtime::trace
