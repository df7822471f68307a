// What each request's latest position chose at each layer, for smoothing
// (runtime/router/policies/router_policies.h) and for the flip rate across
// consecutive positions. Bounded: at most `max_requests` requests (the least
// recently seen leaves first, ties to the lower id), and a request unseen for
// `idle_steps` steps is forgotten. Deterministic: the same calls in the same
// order give the same state, so every rank that records the same tokens in
// the same order holds the same history.
#pragma once

#include <cstddef>
#include <cstdint>
#include <set>
#include <span>
#include <unordered_map>
#include <utility>
#include <vector>

namespace moed::runtime {

class RequestHistory {
 public:
  RequestHistory(int layers, int max_k, std::size_t max_requests, std::uint64_t idle_steps);

  // The experts position - 1 of `request` chose at `layer`; empty when
  // position is 0 or position - 1 was not recorded (or was forgotten).
  std::span<const std::uint32_t> previous(std::uint64_t request, int layer, std::uint32_t position) const;

  // Records what `position` of `request` chose at `layer` during `step`.
  // Says whether position - 1 was known there, and if so whether the set of
  // experts differs from its set (a flip).
  enum class Change { unknown, same, flipped };
  Change record(std::uint64_t request, int layer, std::uint32_t position, std::span<const std::uint32_t> experts,
                std::uint64_t step);
  // Forgets the requests unseen since step - idle_steps.
  void end_step(std::uint64_t step);

  std::size_t size() const { return entries_.size(); }

 private:
  struct Entry {
    std::uint64_t last_step = 0;
    std::vector<std::uint32_t> position_plus_one;  // per layer; 0: none recorded
    std::vector<std::uint32_t> count;              // per layer
    std::vector<std::uint32_t> experts;            // [layer * max_k + i]
  };
  void forget(std::uint64_t request);

  int layers_, max_k_;
  std::size_t max_requests_;
  std::uint64_t idle_steps_;
  std::unordered_map<std::uint64_t, Entry> entries_;
  std::set<std::pair<std::uint64_t, std::uint64_t>> by_age_;  // (last_step, request)
};

// Whether two expert lists hold the same set.
bool same_experts(std::span<const std::uint32_t> a, std::span<const std::uint32_t> b);

}  // namespace moed::runtime
