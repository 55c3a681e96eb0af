// The HTTP/1.1 engine of the admin endpoint: a few threads (about one per core), each with its
// own epoll set over non-blocking sockets, accept on a shared listening socket (EPOLLEXCLUSIVE),
// keep-alive; reads (GET/HEAD) are answered on the loop thread, mutating requests on a pool of
// handler threads whose replies the loop writes. On a machine with few cores this keeps the read
// tail short where one thread per connection made 64 connections queue behind the scheduler.
// GETs that may block in file I/O (the `blocking` predicate, e.g. a route that reads a blob) run
// on a small pool of their own, so one slow disk read never stalls the other connections of its
// loop. Requests are parsed by request_parser.h (Boost.Beast plus the RFC 9112 checks); this
// file holds no HTTP syntax of its own.
//
// Limits (all enforced without blocking a thread): header bytes (431), body bytes (413, checked
// against Content-Length before the body is read), chunked bodies refused unread (411), every
// malformed or ambiguous head 400 (see request_parser.h). Error responses close the connection
// lingering (the rest of the request is read and dropped for a bounded time) so the client sees
// the response rather than a reset.
//
// Time limits, as nginx's client_header_timeout / client_body_timeout / send_timeout /
// keepalive_timeout, except that the head and body deadlines are for the whole head and the
// whole body and do not restart when a byte arrives:
// - a request head must be complete header_timeout_ms after its first byte (after the accept
//   for a connection's first request), the body body_timeout_ms after the head: past either
//   deadline the client gets 408 and the connection closes;
// - a request that makes no progress for read_timeout_ms is closed, so is a response the client
//   does not read for write_timeout_ms, and an idle keep-alive connection after its timeout.
//
// Connection budget: at most max_connections at once, at most max_connections_per_client from
// one client address. When a new connection would pass either limit, the engine closes the
// connection that costs the least to lose instead, as nginx reuses its idle keep-alive
// connections when worker_connections run out, and goes further to keep the endpoint reachable
// under slowloris: first connections already closing (lingering after an error), then idle
// ones (keep-alive between requests, or accepted with nothing sent yet), then those still
// sending a request head, then those still sending a body; oldest first within each class, from
// the same client address when that address is at its cap. Connections whose request is being
// answered or whose response is being written are never evicted. A client trickling headers
// over many connections therefore cannot lock others out: a new connection (a /healthz probe,
// an authorised call) takes the place of the oldest trickler and is answered at once. Only when
// every connection in the budget is busy does a new one get 503 + Retry-After to its first
// request (such rejected connections are bounded too: past another max_connections, closed at
// once).
//
// Replies produced over time (reply_stream.h): a handler may return a Reply with a stream; the
// loop writes its head and then each chunk as the producer sends it (or, deferred, the whole
// reply when it arrives), keeping the connection active meanwhile. While the producer is silent
// no timeout applies; a chunk the client does not read for write_timeout_ms closes the
// connection. When the connection closes before the stream ends (the client closed or reset it,
// the write timeout, the drain deadline), the stream is cancelled, which runs its producer's
// cancel function.
//
// Drain (graceful shutdown): stop accepting, close idle keep-alive connections, let requests
// already started (their first byte arrived before the drain began) finish, their responses
// saying Connection: close; a request that starts after the drain began gets 503. Run returns
// when nothing is left; whatever is still open at the deadline is closed.
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
#include <unordered_map>
#include <vector>

#include "absl/status/statusor.h"
#include "api/http/metrics.h"
#include "api/http/request_parser.h"
#include "api/http/router.h"

namespace loradb::http {

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
  size_t max_connections_per_client = 64;  // per client IP address
  size_t max_header_bytes = 16 << 10;      // at most 64 KiB
  size_t max_body_bytes = 1 << 20;
  int read_timeout_ms = 5000;     // no progress on a request for this long: closed
  int header_timeout_ms = 10000;  // a whole request head, from its first byte
  int body_timeout_ms = 60000;    // a whole request body, from the end of its head
  int write_timeout_ms = 5000;
  int keep_alive_timeout_ms = 5000;
  int keep_alive_max_requests = 1000;
};

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
  struct Mailbox;
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
  // Writes `reply`, or for a reply with a stream (reply_stream.h) its head (streamed kind) and
  // attaches the stream so Pump writes the rest as it arrives; false when `c` was closed.
  bool Answer(Loop* loop, Conn* c, const Reply& reply, bool head, bool close, bool then_process);
  // Writes what `c`'s stream produced since the last call (chunks, the last chunk, or the
  // deferred reply); the connection takes its next request once the stream has ended.
  void Pump(Loop* loop, Conn* c);
  // Answers `reply` and closes lingering; false when `c` was closed.
  bool FailAndLinger(Loop* loop, Conn* c, const Reply& reply);
  void Close(Loop* loop, Conn* c);
  void CheckDeadlines(Loop* loop);
  // Admits a new connection into the budget, choosing a connection to evict when the budget or
  // the client's share is full (*victim_loop/fd/id; victim_loop null when none). False when
  // nothing can be evicted: the new connection is turned away.
  bool Admit(Conn* c, Loop** victim_loop, int* victim_fd, uint64_t* victim_id);
  // Takes `c` out of the budget (budget_mu_ held).
  void Unadmit(Conn* c);
  // Closes connection (fd, id) of `loop` chosen for eviction, at once when it is idle or
  // unfinished, else after the response it is being sent (called on `loop`'s thread).
  void Evict(Loop* loop, int fd, uint64_t id);
  // Records where `c` is in its request cycle (read by Admit on other loops).
  void SetPhase(Conn* c, int phase, int64_t since_ms);
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
  std::atomic<size_t> rejected_{0};  // connections being turned away
  std::atomic<uint64_t> next_conn_id_{1};

  // The connection budget, shared by the loops: admitted connections not yet closed or
  // evicted, and how many each client address holds.
  std::mutex budget_mu_;
  std::vector<Conn*> admitted_;  // Conn::slot is the index
  std::unordered_map<std::string, size_t> per_client_;

  // Mutating requests; blocking reads.
  std::unique_ptr<Pool> handlers_;
  std::unique_ptr<Pool> readers_;
};

}  // namespace loradb::http

#endif  // LORADB_API_HTTP_EVENT_SERVER_H_
