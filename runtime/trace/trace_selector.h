// Which requests are traced: a fraction of them ([trace].sample), chosen by a
// hash of the request id so that every rank takes the same decision without
// a word exchanged, plus the ids an operator follows (moectl trace --follow,
// broadcast to every rank at a step boundary). The followed ids are a
// bounded FIFO ([trace].follow_max): the oldest is dropped first.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>

namespace moed::runtime::trace {

class TraceSelector {
 public:
  TraceSelector(double sample, std::size_t follow_max);

  // Sampled or followed.
  bool wants(std::uint64_t request_id) const { return sampled(request_id) || followed(request_id); }
  bool sampled(std::uint64_t request_id) const;
  bool followed(std::uint64_t request_id) const;
  void follow(std::uint64_t request_id);
  // Nothing can be traced: no sampling and nothing followed (the engine skips all trace work).
  bool idle() const { return threshold_ == 0 && follows_.empty(); }
  double sample() const { return sample_; }

 private:
  double sample_;
  std::uint64_t threshold_;  // sampled when the hash is below it; all when sample is 1
  bool all_ = false;
  std::size_t follow_max_;
  std::deque<std::uint64_t> follows_;
};

}  // namespace moed::runtime::trace
