#include "common/write_retry.h"

#include <fmt/format.h>

#include <algorithm>

namespace moed {

std::string WriteRetry::failed(double now_s, const std::string& error) {
  if (consecutive_ == 0) failing_since_s_ = now_s;
  ++failures_, ++consecutive_;
  backoff_s_ = consecutive_ == 1 ? kFirstBackoffS : std::min(kMaxBackoffS, 2 * backoff_s_);
  next_try_s_ = now_s + backoff_s_;
  last_error_ = error;
  return fmt::format("cannot write {} ({} failure{} in a row): {}; the last good file is kept, serving goes on, "
                     "next try in {:g} s",
                     what_, consecutive_, consecutive_ == 1 ? "" : "s", error, backoff_s_);
}

std::string WriteRetry::succeeded() {
  if (consecutive_ == 0) return "";
  const std::string line = fmt::format("{} written again after {} failed tries", what_, consecutive_);
  consecutive_ = 0;
  backoff_s_ = 0;
  last_error_.clear();
  return line;
}

std::string WriteRetry::alert(double now_s) const {
  if (!failing()) return "";
  return fmt::format("cannot write {} for {:.0f} s ({} tries): {}; next try in {:.0f} s", what_,
                     now_s - failing_since_s_, consecutive_, last_error_, std::max(0.0, next_try_s_ - now_s));
}

}  // namespace moed
