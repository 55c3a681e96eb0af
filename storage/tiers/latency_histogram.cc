#include "storage/tiers/latency_histogram.h"

#include <algorithm>
#include <bit>

namespace loradb::tiers {

void LatencyHistogram::Record(absl::Duration d) {
  int64_t us = std::max<int64_t>(absl::ToInt64Microseconds(d), 0);
  int bucket = us == 0 ? 0 : std::bit_width(static_cast<uint64_t>(us));
  buckets_[std::min(bucket, kBuckets - 1)]++;
  ++count_;
  sum_ += d;
  max_ = std::max(max_, d);
}

absl::Duration LatencyHistogram::Quantile(double q) const {
  if (count_ == 0) return absl::ZeroDuration();
  uint64_t rank = static_cast<uint64_t>(q * static_cast<double>(count_ - 1)) + 1;
  uint64_t seen = 0;
  for (int i = 0; i < kBuckets; ++i) {
    seen += buckets_[i];
    if (seen >= rank) return std::min(absl::Microseconds(BucketUpperMicros(i)), max_);
  }
  return max_;
}

}  // namespace loradb::tiers
