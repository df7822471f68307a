// A file the daemon keeps rewriting (the routing statistics) on a disk that
// may fill up or turn read-only. A failed write must not stop serving: the
// last good file stays (writes are atomic), the failure is logged and shown
// (status alerts, metrics), and the write is retried with a backoff that
// doubles from 1 s to 5 min, so a full disk is not hammered every step.
// Pure: the caller passes the clock.
#pragma once

#include <cstdint>
#include <string>

namespace moed {

class WriteRetry {
 public:
  static constexpr double kFirstBackoffS = 1, kMaxBackoffS = 300;

  explicit WriteRetry(std::string what) : what_(std::move(what)) {}

  // Whether a write should be tried at time `now_s` (always, unless failing).
  bool due(double now_s) const { return !failing() || now_s >= next_try_s_; }
  // Returns the line to log.
  std::string failed(double now_s, const std::string& error);
  // Returns the line to log when this ends a run of failures, else "".
  std::string succeeded();

  bool failing() const { return consecutive_ > 0; }
  std::uint64_t failures() const { return failures_; }  // since start
  // For status alerts, while failing: what, why, since when, next try.
  std::string alert(double now_s) const;

 private:
  std::string what_, last_error_;
  std::uint64_t failures_ = 0, consecutive_ = 0;
  double backoff_s_ = 0, next_try_s_ = 0, failing_since_s_ = 0;
};

}  // namespace moed
