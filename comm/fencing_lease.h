// The fencing lease (elastic serving, docs/elastic.md "The fencing lease"):
// whether a rank may still answer its clients the outputs of a step.
//
// A rank that the others left out (it was stopped or cut off past
// [comm].timeout_ms) must not answer: its peers may have reused blocks it
// read. It checks that it is still a member before it answers, but it may
// be stopped between that check and its answer. The others can only have
// left it out after one of them waited [comm].timeout_ms for it in a
// collective of this step or a later one, and each such wait began after
// this step began here (every collective of the step needs this rank's
// part). So while less than `length` (< timeout_ms) has passed since the
// step began on this rank, no decision can have left it out: the lease
// holds, and it answers. Past it, the rank holds its answers back and
// serves the rows again at the next turn, whose collectives prove that it
// is still a member (or fail, and it learns that it was fenced).
//
// It assumes what the deadlines assume: the ranks' clocks run at the same
// rate (no synchronisation), and no member is found lost sooner than
// timeout_ms after it went silent (the watch endpoints report a process
// or link that is gone, not one that is only stopped).
#pragma once

#include <chrono>

namespace moed::comm {

class FencingLease {
 public:
  using Clock = std::chrono::steady_clock;

  // `length`: [comm].lease_ms, or half of timeout_ms where it is 0.
  static std::chrono::milliseconds length_for(std::chrono::milliseconds lease, std::chrono::milliseconds timeout) {
    return lease.count() > 0 ? lease : timeout / 2;
  }

  explicit FencingLease(std::chrono::milliseconds length) : length_(length) {}
  // The step began on this rank (before its first collective).
  void begin(Clock::time_point now) { began_ = now; }
  // Whether this rank may answer the step's outputs at `now`.
  bool holds(Clock::time_point now) const { return now - began_ < length_; }
  std::chrono::milliseconds length() const { return length_; }
  // How long the step has run at `now`.
  std::chrono::milliseconds held(Clock::time_point now) const {
    return std::chrono::duration_cast<std::chrono::milliseconds>(now - began_);
  }

 private:
  std::chrono::milliseconds length_;
  Clock::time_point began_{};
};

}  // namespace moed::comm
