#include "runtime/trace/trace_selector.h"

#include <algorithm>
#include <cmath>

#include "common/error.h"
#include "common/rng.h"

namespace moed::runtime::trace {

namespace {
// Keeps the sampled set apart from other uses of mix64 on the same ids.
constexpr std::uint64_t kSalt = 0x7472616365ull;  // "trace"
}  // namespace

TraceSelector::TraceSelector(double sample, std::size_t follow_max) : sample_(sample), follow_max_(follow_max) {
  MOED_CHECK(sample >= 0 && sample <= 1, "[trace].sample = {} is not a fraction in [0, 1]", sample);
  const double scaled = std::ldexp(sample, 64);
  all_ = scaled >= 0x1.0p64;  // too close to 1 for the threshold: every request
  threshold_ = all_ ? ~std::uint64_t{0} : std::uint64_t(scaled);
}

bool TraceSelector::sampled(std::uint64_t request_id) const {
  if (threshold_ == 0) return false;
  return all_ || mix64(request_id ^ kSalt) < threshold_;
}

bool TraceSelector::followed(std::uint64_t request_id) const {
  return std::find(follows_.begin(), follows_.end(), request_id) != follows_.end();
}

void TraceSelector::follow(std::uint64_t request_id) {
  if (follow_max_ == 0 || followed(request_id)) return;
  if (follows_.size() == follow_max_) follows_.pop_front();
  follows_.push_back(request_id);
}

}  // namespace moed::runtime::trace
