#include "runtime/router/policies/request_history.h"

#include <algorithm>

#include "common/error.h"

namespace moed::runtime {

bool same_experts(std::span<const std::uint32_t> a, std::span<const std::uint32_t> b) {
  if (a.size() != b.size()) return false;
  for (std::uint32_t e : a)
    if (std::find(b.begin(), b.end(), e) == b.end()) return false;
  return true;
}

RequestHistory::RequestHistory(int layers, int max_k, std::size_t max_requests, std::uint64_t idle_steps)
    : layers_(layers), max_k_(max_k), max_requests_(max_requests), idle_steps_(idle_steps) {
  MOED_CHECK(layers > 0 && max_k > 0 && max_requests > 0, "request history of {} layers, k {}, {} requests", layers,
             max_k, max_requests);
}

std::span<const std::uint32_t> RequestHistory::previous(std::uint64_t request, int layer,
                                                        std::uint32_t position) const {
  if (position == 0) return {};
  const auto it = entries_.find(request);
  if (it == entries_.end() || it->second.position_plus_one[std::size_t(layer)] != position) return {};
  const Entry& e = it->second;
  return {e.experts.data() + std::size_t(layer) * std::size_t(max_k_), e.count[std::size_t(layer)]};
}

RequestHistory::Change RequestHistory::record(std::uint64_t request, int layer, std::uint32_t position,
                                              std::span<const std::uint32_t> experts, std::uint64_t step) {
  MOED_CHECK(layer >= 0 && layer < layers_ && experts.size() <= std::size_t(max_k_),
             "request history: layer {} of {}, {} experts (at most {})", layer, layers_, experts.size(), max_k_);
  auto it = entries_.find(request);
  if (it == entries_.end()) {
    if (entries_.size() >= max_requests_) forget(by_age_.begin()->second);
    Entry fresh;
    fresh.position_plus_one.assign(std::size_t(layers_), 0);
    fresh.count.assign(std::size_t(layers_), 0);
    fresh.experts.assign(std::size_t(layers_) * std::size_t(max_k_), 0);
    fresh.last_step = step;
    it = entries_.emplace(request, std::move(fresh)).first;
    by_age_.emplace(step, request);
  } else if (it->second.last_step != step) {
    by_age_.erase({it->second.last_step, request});
    it->second.last_step = step;
    by_age_.emplace(step, request);
  }
  Entry& e = it->second;
  const std::size_t l = std::size_t(layer);
  std::uint32_t* stored = e.experts.data() + l * std::size_t(max_k_);
  Change change = Change::unknown;
  if (position > 0 && e.position_plus_one[l] == position)
    change = same_experts({stored, e.count[l]}, experts) ? Change::same : Change::flipped;
  e.position_plus_one[l] = position + 1;
  e.count[l] = std::uint32_t(experts.size());
  std::copy(experts.begin(), experts.end(), stored);
  return change;
}

void RequestHistory::end_step(std::uint64_t step) {
  while (!by_age_.empty() && by_age_.begin()->first + idle_steps_ <= step) forget(by_age_.begin()->second);
}

void RequestHistory::forget(std::uint64_t request) {
  const auto it = entries_.find(request);
  if (it == entries_.end()) return;
  by_age_.erase({it->second.last_step, request});
  entries_.erase(it);
}

}  // namespace moed::runtime
