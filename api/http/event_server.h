// The event-loop HTTP/1.1 engine of the admin endpoint: a few threads (about one per core), each
// with its own epoll set over non-blocking sockets, accept on a shared listening socket
// (EPOLLEXCLUSIVE), keep-alive; reads (GET/HEAD) are answered on the loop thread, mutating
// requests on a pool of handler threads whose replies the loop writes. On a machine
// with few cores this keeps the read tail short where one thread per connection made 64
// connections queue behind the scheduler. GETs that may block in file I/O (the `blocking`
// predicate, e.g. a route that reads a blob) run on a small pool of their own, so one slow disk
// read never stalls the other connections of its loop.
//
// Limits (all enforced without blocking a thread): header bytes (431), body bytes (413, checked
// against Content-Length before the body is read), chunked bodies refused unread (411), open
// connections (past the limit a connection gets 503 + Retry-After to its first request), a
// request that makes no progress for read_timeout_ms is closed, so is a response the client
// does not read for write_timeout_ms, and an idle keep-alive connection after its timeout. Error
// responses that close the connection close it lingering (the rest of the request is read and
// dropped for a bounded time) so the client sees the response rather than a reset.
//
// Drain (graceful shutdown): stop accepting, close idle keep-alive connections, let requests
// already started finish (their responses say Connection: close), then Run returns; whatever is
// still open at the deadline is closed.
#ifndef LORADB_API_HTTP_EVENT_SERVER_H_
#define LORADB_API_HTTP_EVENT_SERVER_H_

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "api/http/metrics.h"
#include "api/http/router.h"

namespace loradb::http {

// One parsed request handed to the handler.
struct HttpRequest {
  std::string method;  // as sent ("HEAD" is answered by the GET route without a body)
  std::string target;  // raw path + query, still percent-encoded
  std::string host;
  std::string authorization;
  std::string content_type;
  std::multimap<std::string, std::string> query;  // decoded key/value pairs
  std::string body;
};

// Answers one request (on a loop thread for reads, on a pool thread for mutating requests and
// blocking reads). A reply header "Connection: close" closes the connection after the response.
using RequestHandler = std::function<Reply(HttpRequest& request)>;

struct EventServerOptions {
  int threads = 2;
  // Mutating requests (any method but GET/HEAD: durable commits, adapter loads) run on this many
  // handler threads so they never stall the reads served on the loop threads.
  int handler_threads = 64;
  // GETs/HEADs for which `blocking` returns true (called on the loop thread: keep it cheap) run
  // on `blocking_threads` pool threads, whose replies the loop writes. 0 threads, or no
  // predicate: every read is answered on the loop.
  int blocking_threads = 4;
  std::function<bool(const HttpRequest&)> blocking;
  size_t max_connections = 128;
  size_t max_header_bytes = 16 << 10;
  size_t max_body_bytes = 1 << 20;
  int read_timeout_ms = 5000;
  int write_timeout_ms = 5000;
  int keep_alive_timeout_ms = 5000;
  int keep_alive_max_requests = 1000;
};

// Percent-decodes a query component ('+' is a space); malformed escapes stay as they are.
std::string DecodeQueryComponent(const std::string& s);
// Splits "a=1&b=2" into decoded pairs (a key without '=' has an empty value).
std::multimap<std::string, std::string> ParseQueryString(const std::string& query);

class EventServer {
 public:
  // Binds and listens on host:port (port 0: ephemeral; see port()). Unavailable when the
  // address cannot be bound.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<EventServer>> Bind(const std::string& host,
                                                                         int port,
                                                                         EventServerOptions options,
                                                                         HttpMetrics* metrics,
                                                                         RequestHandler handler);
  ~EventServer();
  EventServer(const EventServer&) = delete;
  EventServer& operator=(const EventServer&) = delete;

  int port() const { return port_; }

  // Runs the loops on options.threads threads (the caller's thread is one of them) until a
  // drain has finished. Call once.
  void Run();

  // Starts the drain (thread-safe, idempotent); connections still open at `deadline` are
  // closed.
  void Drain(std::chrono::steady_clock::time_point deadline);

 private:
  struct Loop;
  struct Conn;
  EventServer(EventServerOptions options, HttpMetrics* metrics, RequestHandler handler);
  void LoopMain(Loop* loop);
  void Accept(Loop* loop);
  void OnEvent(Loop* loop, Conn* c, uint32_t events);
  // Parses and answers every complete request buffered on `c`; false when `c` was closed.
  bool Process(Loop* loop, Conn* c);
  // Writes what is buffered; false when `c` was closed. With `then_process`, a completed
  // write goes on to the next buffered request.
  bool Flush(Loop* loop, Conn* c, bool then_process);
  void Respond(Conn* c, const Reply& reply, bool head, bool close);
  // Answers `reply` and closes lingering; false when `c` was closed.
  bool FailAndLinger(Loop* loop, Conn* c, const Reply& reply);
  void Close(Loop* loop, Conn* c);
  void CheckDeadlines(Loop* loop);
  struct Job;
  struct Pool;
  // Hands `c`'s request to `pool` (c is busy until Complete writes the reply).
  void Submit(Pool* pool, Loop* loop, Conn* c, HttpRequest req, bool head, bool close);
  void PoolMain(Pool* pool);
  // Writes the replies the pool threads finished for `loop`'s connections.
  void Complete(Loop* loop);

  const EventServerOptions options_;
  HttpMetrics* const metrics_;
  const RequestHandler handler_;
  int listen_fd_ = -1;
  int port_ = 0;
  std::vector<std::unique_ptr<Loop>> loops_;
  std::atomic<bool> draining_{false};
  std::atomic<int64_t> drain_deadline_ns_{0};
  std::atomic<size_t> open_{0};      // connections being served
  std::atomic<size_t> rejected_{0};  // connections being turned away
  std::atomic<uint64_t> next_conn_id_{1};

  // Mutating requests; blocking reads.
  std::unique_ptr<Pool> handlers_;
  std::unique_ptr<Pool> readers_;
};

}  // namespace loradb::http

#endif  // LORADB_API_HTTP_EVENT_SERVER_H_
