// A fixed-bucket latency histogram (power-of-two microsecond buckets) for tier statistics.
// Not thread-safe; owners guard it with their own mutex and copy it out in stats().
#ifndef LORADB_STORAGE_TIERS_LATENCY_HISTOGRAM_H_
#define LORADB_STORAGE_TIERS_LATENCY_HISTOGRAM_H_

#include <array>
#include <cstdint>
#include <string>

#include "absl/time/time.h"

namespace loradb::tiers {

class LatencyHistogram {
 public:
  // Bucket i counts samples in [2^(i-1), 2^i) microseconds (bucket 0: below 1 us); the last
  // bucket also takes everything longer.
  static constexpr int kBuckets = 34;

  void Record(absl::Duration d);
  uint64_t count() const { return count_; }
  absl::Duration sum() const { return sum_; }
  absl::Duration max() const { return max_; }
  absl::Duration mean() const { return count_ == 0 ? absl::ZeroDuration() : sum_ / count_; }
  // Upper bound of the bucket holding the q-quantile (0..1); zero when empty.
  absl::Duration Quantile(double q) const;
  const std::array<uint64_t, kBuckets>& buckets() const { return buckets_; }
  // Upper bound of bucket `i` in microseconds.
  static uint64_t BucketUpperMicros(int i) { return uint64_t{1} << i; }

 private:
  std::array<uint64_t, kBuckets> buckets_{};
  uint64_t count_ = 0;
  absl::Duration sum_ = absl::ZeroDuration();
  absl::Duration max_ = absl::ZeroDuration();
};

}  // namespace loradb::tiers

#endif  // LORADB_STORAGE_TIERS_LATENCY_HISTOGRAM_H_
