#include "api/http/metrics.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace loradb::http {

std::string PromLabel(const std::string& value) {
  std::string out;
  out.reserve(value.size());
  for (char c : value) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '"') {
      out += "\\\"";
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out.push_back(c);
    }
  }
  return out;
}

void HttpMetrics::Observe(const std::string& route, const std::string& method, int status,
                          double seconds) {
  MutexLock lock(&mu_);
  ++requests_[{route, method, status}];
  Histogram& h = latency_[route];
  for (size_t i = 0; i < kBuckets.size(); ++i) {
    if (seconds <= kBuckets[i]) ++h.counts[i];
  }
  ++h.count;
  h.sum += seconds;
}

void HttpMetrics::Render(std::string* out) const {
  MutexLock lock(&mu_);
  absl::StrAppend(out, "# HELP loradb_http_requests_total HTTP requests served.\n",
                  "# TYPE loradb_http_requests_total counter\n");
  for (const auto& [key, n] : requests_) {
    absl::StrAppend(out, "loradb_http_requests_total{route=\"", PromLabel(std::get<0>(key)),
                    "\",method=\"", PromLabel(std::get<1>(key)), "\",code=\"", std::get<2>(key),
                    "\"} ", n, "\n");
  }
  absl::StrAppend(out, "# HELP loradb_http_request_duration_seconds Time to handle a request.\n",
                  "# TYPE loradb_http_request_duration_seconds histogram\n");
  for (const auto& [route, h] : latency_) {
    std::string label = PromLabel(route);
    for (size_t i = 0; i < kBuckets.size(); ++i) {
      absl::StrAppend(out, "loradb_http_request_duration_seconds_bucket{route=\"", label,
                      "\",le=\"", absl::StrFormat("%g", kBuckets[i]), "\"} ", h.counts[i], "\n");
    }
    absl::StrAppend(out, "loradb_http_request_duration_seconds_bucket{route=\"", label,
                    "\",le=\"+Inf\"} ", h.count, "\n");
    absl::StrAppend(out, "loradb_http_request_duration_seconds_sum{route=\"", label, "\"} ",
                    absl::StrFormat("%.9g", h.sum), "\n");
    absl::StrAppend(out, "loradb_http_request_duration_seconds_count{route=\"", label, "\"} ",
                    h.count, "\n");
  }
  absl::StrAppend(out, "# HELP loradb_http_in_flight_requests Requests being handled now.\n",
                  "# TYPE loradb_http_in_flight_requests gauge\n",
                  "loradb_http_in_flight_requests ", in_flight.load(), "\n");
  absl::StrAppend(out, "# HELP loradb_http_connections_open Connections being served now.\n",
                  "# TYPE loradb_http_connections_open gauge\n", "loradb_http_connections_open ",
                  connections_open.load(), "\n");
  absl::StrAppend(out,
                  "# HELP loradb_http_connections_rejected_total Connections answered 503 "
                  "because the connection limit was reached.\n",
                  "# TYPE loradb_http_connections_rejected_total counter\n",
                  "loradb_http_connections_rejected_total ", connections_rejected.load(), "\n");
  absl::StrAppend(out,
                  "# HELP loradb_http_connections_evicted_total Idle or unfinished connections "
                  "closed to make room for a new one.\n",
                  "# TYPE loradb_http_connections_evicted_total counter\n",
                  "loradb_http_connections_evicted_total ", connections_evicted.load(), "\n");
  absl::StrAppend(out,
                  "# HELP loradb_http_requests_timed_out_total Requests whose head or body "
                  "missed its deadline (408, connection closed).\n",
                  "# TYPE loradb_http_requests_timed_out_total counter\n",
                  "loradb_http_requests_timed_out_total ", requests_timed_out.load(), "\n");
}

}  // namespace loradb::http
