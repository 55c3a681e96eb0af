// loradb's HTTP admin endpoint: JSON over HTTP/1.1 on a loopback address by default, a bearer
// token for mutating calls, request limits, Prometheus metrics, an OpenAPI 3.1 document built from
// the route table, and graceful shutdown. Routes over the Store are added by AddStoreRoutes
// (store_routes.h); the system routes (/healthz, /metrics, /openapi.json, /) are always present.
#ifndef LORADB_API_HTTP_SERVER_H_
#define LORADB_API_HTTP_SERVER_H_

#include <atomic>
#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "api/http/metrics.h"
#include "api/http/request_parser.h"
#include "api/http/router.h"

namespace loradb::http {

// Connections are served by the event-loop engine (event_server.h): a few loop threads, pools
// for mutating calls and blocking reads, and the limits below.
struct ServerOptions {
  // Loop threads (0: one per hardware thread, 2..8).
  int event_threads = 0;
  // Threads answering mutating calls (durable commits, adapter loads) off the
  // loops. They block in I/O, and concurrent catalog commits overlap (alias moves under 64
  // connections: ~190 req/s with 4, ~850 with 64; see docs/bench/notes/measurements.md, http),
  // so there are many.
  int handler_threads = 64;
  // Threads answering the GETs of routes marked `blocking` (blob reads) off the
  // loops, so a slow disk read never stalls the other connections of a loop. 0: on the loops.
  int blocking_threads = 4;
  std::string host = "127.0.0.1";
  int port = 8080;  // 0 picks an ephemeral port (see Server::port()).
  // Bearer token for mutating calls (and reads with auth_reads). Empty: no token configured, so
  // mutating calls are refused (401) and only loopback addresses may be used.
  std::string token;
  bool auth_reads = false;
  size_t max_body_bytes = 1 << 20;     // larger bodies get 413
  size_t max_header_bytes = 16 << 10;  // larger request heads get 431 (at most 64 KiB)
  // Open connections at once, and from one client address; past either, the engine evicts an
  // idle or unfinished connection, or answers 503 when all are busy (event_server.h).
  int max_connections = 128;
  int max_connections_per_client = 64;
  int read_timeout_ms = 5000;     // a request making no progress for this long is closed
  int header_timeout_ms = 10000;  // a whole request head (408 past it)
  int body_timeout_ms = 60000;    // a whole request body, from the end of its head (408)
  int write_timeout_ms = 5000;
  int keep_alive_timeout_s = 5;
  int keep_alive_max_requests = 1000;
  int drain_timeout_ms = 10000;  // Shutdown waits this long for in-flight requests
};

// Splits "HOST:PORT" ("[::1]:8080" for IPv6). InvalidArgument on a malformed address or port.
[[nodiscard]] absl::Status ParseListenAddress(const std::string& listen, std::string* host,
                                              int* port);
// True for 127.0.0.0/8, ::1 and "localhost".
bool IsLoopbackHost(const std::string& host);
// Reads a token file: the first line, surrounding whitespace removed. InvalidArgument when it is
// shorter than 16 bytes or has control characters; the errno status when unreadable.
[[nodiscard]] absl::StatusOr<std::string> ReadTokenFile(const std::string& path);

// Thread safety: Bind/Serve are called once, from one thread; Shutdown may be called from any
// thread (typically a signal-waiting thread) at any time, also before Serve.
class Server {
 public:
  // Validates `options` (non-loopback host without token, auth_reads without token, limits).
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<Server>> Create(ServerOptions options);
  ~Server();
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  // Routes may be added until Serve starts.
  Router* router() { return &router_; }
  // Adds text appended to /metrics (Prometheus format) at every scrape.
  void AddMetricsSource(std::function<void(std::string*)> source);

  // Binds the listening socket. After this, port() is the bound port.
  [[nodiscard]] absl::Status Bind();
  int port() const { return port_; }

  // Serves until Shutdown; returns once every worker has finished.
  [[nodiscard]] absl::Status Serve();

  // Graceful shutdown: the listening socket closes, idle connections close, requests already
  // started (their first byte arrived) finish with Connection: close, requests started later
  // get 503, all up to drain_timeout_ms; then Serve returns.
  void Shutdown();
  bool draining() const { return draining_.load(); }

  const HttpMetrics& metrics() const { return metrics_; }

 private:
  explicit Server(ServerOptions options);
  struct Impl;
  absl::Status AddSystemRoutes();
  // Answers `req` as `method` (HEAD is answered by the GET route); `req` is moved from.
  Reply Dispatch(const std::string& method, HttpRequest& req, std::string* route_out);

  ServerOptions options_;
  Router router_;
  HttpMetrics metrics_;
  std::vector<std::function<void(std::string*)>> metrics_sources_;
  std::unique_ptr<Impl> impl_;
  std::atomic<bool> draining_{false};
  int port_ = 0;
  bool loopback_ = true;
};

}  // namespace loradb::http

#endif  // LORADB_API_HTTP_SERVER_H_
