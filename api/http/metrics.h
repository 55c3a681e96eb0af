// Request metrics of the HTTP admin endpoint, rendered in the Prometheus text format (0.0.4).
#ifndef LORADB_API_HTTP_METRICS_H_
#define LORADB_API_HTTP_METRICS_H_

#include <array>
#include <atomic>
#include <cstdint>
#include <map>
#include <string>
#include <tuple>

#include "absl/base/thread_annotations.h"
#include "storage/util/mutex.h"

namespace loradb::http {

// Thread-safe counters: requests by (route, method, status), a latency histogram per route,
// in-flight requests, open connections, connections turned away, evicted or timed out.
class HttpMetrics {
 public:
  // Upper bounds (seconds) of the latency histogram buckets; +Inf is implicit.
  static constexpr std::array<double, 12> kBuckets = {0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005,
                                                      0.01,   0.025,   0.05,   0.1,   0.5,    2.5};

  // Records one finished request. `route` is the matched pattern or "unmatched".
  void Observe(const std::string& route, const std::string& method, int status, double seconds);

  std::atomic<int64_t> in_flight{0};
  std::atomic<int64_t> connections_open{0};
  std::atomic<uint64_t> connections_rejected{0};
  // Idle or unfinished connections closed to make room for a new one (see event_server.h).
  std::atomic<uint64_t> connections_evicted{0};
  // Connections closed because a request head or body missed its deadline.
  std::atomic<uint64_t> requests_timed_out{0};

  // Appends the metrics in Prometheus text format to `out`.
  void Render(std::string* out) const;

 private:
  struct Histogram {
    std::array<uint64_t, kBuckets.size()> counts{};
    uint64_t count = 0;
    double sum = 0;
  };
  // loradb::Mutex, not absl::Mutex: visible to ThreadSanitizer (storage/util/mutex.h).
  mutable Mutex mu_;
  std::map<std::tuple<std::string, std::string, int>, uint64_t> requests_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, Histogram> latency_ ABSL_GUARDED_BY(mu_);
};

// Escapes a Prometheus label value (backslash, double quote, newline).
std::string PromLabel(const std::string& value);

}  // namespace loradb::http

#endif  // LORADB_API_HTTP_METRICS_H_
