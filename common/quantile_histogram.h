// Streaming quantiles of positive durations in bounded memory: a log-linear
// histogram (as HdrHistogram does), so that a daemon serving for months keeps
// its latency percentiles in the same few kilobytes on its first step and its
// billionth.
//
// Buckets split each power of two into kSubBuckets equal ratios, from
// kMinValue to kMaxValue. A quantile is the geometric middle of the bucket
// holding the rank-ceil(q n) sample (nearest rank), clamped to the exact
// minimum and maximum seen, which the first and last ranks return as they are: its relative error is at most half a bucket,
// 2^(1/(2 kSubBuckets)) - 1, about 0.55%. Values at or below kMinValue
// (zero included) count in the first bucket; values above kMaxValue in the last.
#pragma once

#include <array>
#include <cstdint>

namespace moed {

class QuantileHistogram {
 public:
  static constexpr int kSubBuckets = 64;          // per power of two
  static constexpr double kMinValue = 1e-7;       // 0.1 us, in the caller's unit (seconds)
  static constexpr int kOctaves = 37;             // up to kMinValue * 2^37: about 13,700 s
  static constexpr int kBuckets = kSubBuckets * kOctaves;
  // The largest relative error of quantile() for values inside the range.
  static double relative_error();

  void add(double value);
  // q in [0, 1]; 0 when empty.
  double quantile(double q) const;
  std::uint64_t count() const { return count_; }
  double min() const { return count_ ? min_ : 0; }
  double max() const { return count_ ? max_ : 0; }
  double sum() const { return sum_; }

 private:
  static int bucket_of(double value);
  static double middle_of(int bucket);

  std::array<std::uint64_t, kBuckets> counts_{};
  std::uint64_t count_ = 0;
  double min_ = 0, max_ = 0, sum_ = 0;
};

}  // namespace moed
