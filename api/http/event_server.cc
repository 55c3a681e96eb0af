#include "api/http/event_server.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <thread>
#include <unordered_map>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "api/http/reply_stream.h"

namespace loradb::http {
namespace {

constexpr int kListenBacklog = 1024;
constexpr int kTickMs = 50;                // deadline scan period
constexpr int kLingerMs = 2000;            // how long a closing connection's input is drained
constexpr size_t kLingerBytes = 64 << 20;  // ... and how much of it at most
constexpr size_t kReadChunk = 16 << 10;

int64_t NowMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

int64_t NowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

const char* Reason(int status) {
  switch (status) {
    case 100:
      return "Continue";
    case 200:
      return "OK";
    case 201:
      return "Created";
    case 202:
      return "Accepted";
    case 204:
      return "No Content";
    case 400:
      return "Bad Request";
    case 401:
      return "Unauthorized";
    case 403:
      return "Forbidden";
    case 404:
      return "Not Found";
    case 405:
      return "Method Not Allowed";
    case 408:
      return "Request Timeout";
    case 409:
      return "Conflict";
    case 411:
      return "Length Required";
    case 413:
      return "Payload Too Large";
    case 414:
      return "URI Too Long";
    case 415:
      return "Unsupported Media Type";
    case 422:
      return "Unprocessable Content";
    case 429:
      return "Too Many Requests";
    case 431:
      return "Request Header Fields Too Large";
    case 500:
      return "Internal Server Error";
    case 501:
      return "Not Implemented";
    case 503:
      return "Service Unavailable";
    default:
      return status < 300 ? "OK" : status < 500 ? "Client Error" : "Server Error";
  }
}

// The per-client budget's key: the peer's IP address (no port).
std::string ClientKey(const sockaddr_storage& peer) {
  if (peer.ss_family == AF_INET6) {
    const auto* a = reinterpret_cast<const sockaddr_in6*>(&peer);
    return std::string(reinterpret_cast<const char*>(&a->sin6_addr), sizeof(a->sin6_addr));
  }
  if (peer.ss_family == AF_INET) {
    const auto* a = reinterpret_cast<const sockaddr_in*>(&peer);
    return std::string(reinterpret_cast<const char*>(&a->sin_addr), sizeof(a->sin_addr));
  }
  return std::string();
}

}  // namespace

// Where a connection is in its request cycle, in the order connections are evicted.
enum Phase : int {
  kClosing = 0,  // answered with an error, input drained until EOF or the linger deadline
  kIdle = 1,     // nothing of a next request received (just accepted, or keep-alive)
  kHead = 2,     // part of a request head received
  kBody = 3,     // head checked, part of the body outstanding
  kActive = 4,   // being answered or its response being written: never evicted
};

struct EventServer::Conn {
  int fd = -1;
  uint64_t id = 0;
  Loop* loop = nullptr;
  std::string client;      // the peer's address bytes (the per-client budget's key)
  bool busy = false;       // a handler thread is answering its request
  bool rejecting = false;  // past the connection limit: every request gets 503
  bool lingering = false;  // response sent, input drained and dropped until EOF or deadline
  bool close_after_write = false;
  bool continue_sent = false;
  bool peer_closed = false;    // the client shut down its sending side
  bool evict_pending = false;  // evicted while active: closes after the response
  bool in_before_drain = false;       // the buffered input's first byte came before the drain
  bool started_before_drain = false;  // the current request's first byte came before the drain
  int served = 0;
  std::string in;
  std::string out;
  size_t out_off = 0;
  size_t lingered = 0;
  std::unique_ptr<RequestParser> parser;  // the request being received; null between requests
  // The reply being produced by another thread (busy until it ends), and how its response goes
  // out once a deferred reply arrives.
  std::shared_ptr<ReplyStream> stream;
  bool stream_head = false;
  bool stream_close = false;
  int64_t last_progress_ms = 0;
  int64_t head_deadline_ms = 0;  // the current head (or the first one, from the accept)
  int64_t body_deadline_ms = 0;  // 0: not receiving a body
  int64_t linger_deadline_ms = 0;
  // Written by the owning loop, read by Admit on any loop (under budget_mu_).
  std::atomic<int> phase{kIdle};
  std::atomic<int64_t> phase_since_ms{0};
  // Guarded by budget_mu_: in admitted_ at index `slot` (false once evicted or closed).
  bool admitted = false;
  size_t slot = 0;
};

// Where streams tell a loop that they have something to write: shared with the streams' wake
// functions, which may outlive the loop (a producer thread holding its stream), so writes to the
// eventfd stop under the lock once the loop is gone.
struct EventServer::Mailbox {
  std::mutex mu;
  int wake_fd = -1;  // -1 once the loop is gone
  std::vector<std::pair<int, uint64_t>> ready;  // (fd, connection id)
  void Post(int fd, uint64_t conn_id) {
    std::lock_guard<std::mutex> lock(mu);
    if (wake_fd < 0) return;
    ready.emplace_back(fd, conn_id);
    uint64_t one = 1;
    ssize_t n = ::write(wake_fd, &one, sizeof(one));
    (void)n;
  }
};

struct EventServer::Loop {
  int epoll_fd = -1;
  int wake_fd = -1;
  std::shared_ptr<Mailbox> mailbox = std::make_shared<Mailbox>();
  bool listening = false;
  int64_t listen_paused_until_ms = 0;  // out of file descriptors: accept again after this
  std::unordered_map<int, std::unique_ptr<Conn>> conns;
  // Replies finished by handler threads, written by the loop.
  struct Done {
    int fd;
    uint64_t conn_id;
    Reply reply;
    bool head;
    bool close;
  };
  // Connections of this loop that another loop's Admit chose to evict.
  struct Eviction {
    int fd;
    uint64_t conn_id;
  };
  std::mutex done_mu;
  std::vector<Done> done;
  std::vector<Eviction> evictions;
};

struct EventServer::Job {
  Loop* loop;
  int fd;
  uint64_t conn_id;
  HttpRequest request;
  bool head;
  bool close;
};

// Threads answering jobs off the loops; each connection has at most one job queued or running,
// so the queue is bounded by the connection limit.
struct EventServer::Pool {
  int size = 0;
  std::mutex mu;
  std::condition_variable cv;
  std::deque<std::unique_ptr<Job>> jobs;
  bool stop = false;
  std::vector<std::thread> threads;
};

EventServer::EventServer(EventServerOptions options, HttpMetrics* metrics, RequestHandler handler)
    : options_(options),
      metrics_(metrics),
      handler_(std::move(handler)),
      handlers_(std::make_unique<Pool>()),
      readers_(std::make_unique<Pool>()) {
  handlers_->size = std::max(1, options_.handler_threads);
  readers_->size = options_.blocking ? std::max(0, options_.blocking_threads) : 0;
}

EventServer::~EventServer() {
  for (auto& loop : loops_) {
    {
      std::lock_guard<std::mutex> lock(loop->mailbox->mu);
      loop->mailbox->wake_fd = -1;
    }
    for (auto& [fd, c] : loop->conns) {
      if (c->stream != nullptr) c->stream->Cancel();
      ::close(fd);
    }
    if (loop->epoll_fd >= 0) ::close(loop->epoll_fd);
    if (loop->wake_fd >= 0) ::close(loop->wake_fd);
  }
  if (listen_fd_ >= 0) ::close(listen_fd_);
}

absl::StatusOr<std::unique_ptr<EventServer>> EventServer::Bind(const std::string& host, int port,
                                                               EventServerOptions options,
                                                               HttpMetrics* metrics,
                                                               RequestHandler handler) {
  if (options.threads < 1 || options.max_connections < 1 ||
      options.max_connections_per_client < 1 || options.read_timeout_ms < 1 ||
      options.header_timeout_ms < 1 || options.body_timeout_ms < 1 ||
      options.write_timeout_ms < 1) {
    return absl::InvalidArgumentError("event server limits must be positive");
  }
  if (options.max_header_bytes < 64 || options.max_header_bytes > (64 << 10)) {
    return absl::InvalidArgumentError("max_header_bytes must be 64 B .. 64 KiB");
  }
  std::unique_ptr<EventServer> s(new EventServer(options, metrics, std::move(handler)));
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* res = nullptr;
  std::string port_text = absl::StrCat(port);
  if (::getaddrinfo(host.c_str(), port_text.c_str(), &hints, &res) != 0 || res == nullptr) {
    return absl::UnavailableError(absl::StrCat("cannot resolve ", host));
  }
  int fd = -1;
  for (addrinfo* ai = res; ai != nullptr && fd < 0; ai = ai->ai_next) {
    fd = ::socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, ai->ai_protocol);
    if (fd < 0) continue;
    int one = 1;
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (::bind(fd, ai->ai_addr, ai->ai_addrlen) != 0 || ::listen(fd, kListenBacklog) != 0) {
      ::close(fd);
      fd = -1;
    }
  }
  ::freeaddrinfo(res);
  if (fd < 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot bind ", host, ":", port, " (in use or not permitted)"));
  }
  s->listen_fd_ = fd;
  sockaddr_storage addr{};
  socklen_t len = sizeof(addr);
  if (::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    return absl::InternalError("getsockname failed");
  }
  s->port_ = addr.ss_family == AF_INET6 ? ntohs(reinterpret_cast<sockaddr_in6*>(&addr)->sin6_port)
                                        : ntohs(reinterpret_cast<sockaddr_in*>(&addr)->sin_port);
  for (int i = 0; i < options.threads; ++i) {
    auto loop = std::make_unique<Loop>();
    loop->epoll_fd = ::epoll_create1(EPOLL_CLOEXEC);
    loop->wake_fd = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    loop->mailbox->wake_fd = loop->wake_fd;
    if (loop->epoll_fd < 0 || loop->wake_fd < 0) {
      s->loops_.push_back(std::move(loop));
      return absl::InternalError("epoll/eventfd creation failed");
    }
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.fd = loop->wake_fd;
    ::epoll_ctl(loop->epoll_fd, EPOLL_CTL_ADD, loop->wake_fd, &ev);
    // Every loop waits on the listening socket; EPOLLEXCLUSIVE wakes one of them per
    // connection instead of all.
    ev.events = EPOLLIN | EPOLLEXCLUSIVE;
    ev.data.fd = fd;
    if (::epoll_ctl(loop->epoll_fd, EPOLL_CTL_ADD, fd, &ev) != 0) {
      s->loops_.push_back(std::move(loop));
      return absl::InternalError("epoll_ctl(listen) failed");
    }
    loop->listening = true;
    s->loops_.push_back(std::move(loop));
  }
  return s;
}

void EventServer::Run() {
  for (Pool* pool : {handlers_.get(), readers_.get()}) {
    for (int i = 0; i < pool->size; ++i)
      pool->threads.emplace_back([this, pool] { PoolMain(pool); });
  }
  std::vector<std::thread> threads;
  for (size_t i = 1; i < loops_.size(); ++i) {
    threads.emplace_back([this, i] { LoopMain(loops_[i].get()); });
  }
  LoopMain(loops_[0].get());
  for (auto& t : threads) t.join();
  for (Pool* pool : {handlers_.get(), readers_.get()}) {
    {
      std::lock_guard<std::mutex> lock(pool->mu);
      pool->stop = true;
      pool->jobs.clear();  // their connections are closed
    }
    pool->cv.notify_all();
    for (auto& t : pool->threads) t.join();
    pool->threads.clear();
  }
}

void EventServer::Submit(Pool* pool, Loop* loop, Conn* c, HttpRequest req, bool head, bool close) {
  c->busy = true;
  auto job = std::make_unique<Job>(Job{loop, c->fd, c->id, std::move(req), head, close});
  {
    std::lock_guard<std::mutex> lock(pool->mu);
    pool->jobs.push_back(std::move(job));
  }
  pool->cv.notify_one();
}

void EventServer::PoolMain(Pool* pool) {
  for (;;) {
    std::unique_ptr<Job> job;
    {
      std::unique_lock<std::mutex> lock(pool->mu);
      pool->cv.wait(lock, [&] { return pool->stop || !pool->jobs.empty(); });
      if (pool->stop) return;
      job = std::move(pool->jobs.front());
      pool->jobs.pop_front();
    }
    Reply reply = handler_(job->request);
    Loop* loop = job->loop;
    {
      std::lock_guard<std::mutex> lock(loop->done_mu);
      loop->done.push_back({job->fd, job->conn_id, std::move(reply), job->head, job->close});
    }
    uint64_t one = 1;
    ssize_t n = ::write(loop->wake_fd, &one, sizeof(one));
    (void)n;
  }
}

void EventServer::Complete(Loop* loop) {
  std::vector<Loop::Done> done;
  std::vector<Loop::Eviction> evictions;
  {
    std::lock_guard<std::mutex> lock(loop->done_mu);
    done.swap(loop->done);
    evictions.swap(loop->evictions);
  }
  std::vector<std::pair<int, uint64_t>> ready;
  {
    std::lock_guard<std::mutex> lock(loop->mailbox->mu);
    ready.swap(loop->mailbox->ready);
  }
  for (const Loop::Eviction& e : evictions) Evict(loop, e.fd, e.conn_id);
  for (Loop::Done& d : done) {
    auto it = loop->conns.find(d.fd);
    if (it == loop->conns.end() || it->second->id != d.conn_id) {
      // Closed meanwhile: a reply still being produced is not wanted any more.
      if (d.reply.stream != nullptr) d.reply.stream->Cancel();
      continue;
    }
    Conn* c = it->second.get();
    c->busy = false;
    c->last_progress_ms = NowMs();
    Answer(loop, c, d.reply, d.head, d.close || draining_.load(), /*then_process=*/true);
  }
  for (const auto& [fd, id] : ready) {
    auto it = loop->conns.find(fd);
    if (it == loop->conns.end() || it->second->id != id || it->second->stream == nullptr) continue;
    Pump(loop, it->second.get());
  }
}

bool EventServer::Answer(Loop* loop, Conn* c, const Reply& reply, bool head, bool close,
                         bool then_process) {
  if (reply.stream == nullptr) {
    Respond(c, reply, head, close);
    return Flush(loop, c, then_process);
  }
  // Produced over time: the connection stays busy until the stream ends (Pump).
  c->busy = true;
  c->stream = reply.stream;
  c->stream_head = head;
  c->stream_close = close;
  std::shared_ptr<Mailbox> mailbox = loop->mailbox;
  const int fd = c->fd;
  const uint64_t id = c->id;
  bool ok = true;
  if (!reply.stream->deferred()) {
    Respond(c, reply, head, close);
    ok = Flush(loop, c, /*then_process=*/false);
  }
  // Attach may call the wake function at once; Pump then runs from the next Complete.
  if (ok) reply.stream->Attach([mailbox, fd, id] { mailbox->Post(fd, id); });
  return ok;
}

void EventServer::Pump(Loop* loop, Conn* c) {
  ReplyStream::Taken t = c->stream->Take();
  if (c->stream->deferred()) {
    if (!t.answer.has_value()) return;
    c->stream.reset();
    c->busy = false;
    c->last_progress_ms = NowMs();
    Respond(c, *t.answer, c->stream_head, c->stream_close || draining_.load());
    Flush(loop, c, /*then_process=*/true);
    return;
  }
  if (c->out_off >= c->out.size()) {
    c->out.clear();
    c->out_off = 0;
    c->last_progress_ms = NowMs();  // the write timeout counts from when there is data to send
  }
  if (!t.data.empty() && !c->stream_head) {
    absl::StrAppend(&c->out, absl::Hex(t.data.size()), "\r\n", t.data, "\r\n");
  }
  if (t.ended) {
    if (!c->stream_head) c->out.append("0\r\n\r\n");
    c->stream.reset();
    c->busy = false;
  }
  Flush(loop, c, /*then_process=*/true);
}

void EventServer::Drain(std::chrono::steady_clock::time_point deadline) {
  drain_deadline_ns_.store(
      std::chrono::duration_cast<std::chrono::nanoseconds>(deadline.time_since_epoch()).count());
  draining_.store(true);
  for (auto& loop : loops_) {
    uint64_t one = 1;
    ssize_t n = ::write(loop->wake_fd, &one, sizeof(one));
    (void)n;
  }
}

void EventServer::LoopMain(Loop* loop) {
  std::vector<epoll_event> events(256);
  int64_t next_tick = NowMs() + kTickMs;
  for (;;) {
    if (draining_.load()) {
      if (loop->listening) {
        ::epoll_ctl(loop->epoll_fd, EPOLL_CTL_DEL, listen_fd_, nullptr);
        loop->listening = false;
      }
      // Idle connections (nothing received of a next request, nothing to send) close now.
      std::vector<Conn*> idle;
      for (auto& [fd, c] : loop->conns) {
        if (c->in.empty() && c->parser == nullptr && c->out_off >= c->out.size() &&
            !c->lingering && !c->busy) {
          idle.push_back(c.get());
        }
      }
      for (Conn* c : idle) Close(loop, c);
      if (loop->conns.empty() || NowNs() >= drain_deadline_ns_.load()) break;
    }
    int n = ::epoll_wait(loop->epoll_fd, events.data(), static_cast<int>(events.size()), kTickMs);
    if (n < 0 && errno != EINTR) break;
    for (int i = 0; i < n; ++i) {
      const epoll_event& ev = events[static_cast<size_t>(i)];
      if (ev.data.fd == loop->wake_fd) {
        uint64_t v;
        ssize_t r = ::read(loop->wake_fd, &v, sizeof(v));
        (void)r;
        Complete(loop);
        continue;
      }
      if (ev.data.fd == listen_fd_) {
        if (!draining_.load()) Accept(loop);
        continue;
      }
      auto it = loop->conns.find(ev.data.fd);
      if (it == loop->conns.end()) continue;
      OnEvent(loop, it->second.get(), ev.events);
    }
    int64_t now = NowMs();
    if (now >= next_tick) {
      CheckDeadlines(loop);
      next_tick = now + kTickMs;
      if (!loop->listening && loop->listen_paused_until_ms != 0 &&
          now >= loop->listen_paused_until_ms && !draining_.load()) {
        epoll_event ev{};
        ev.events = EPOLLIN | EPOLLEXCLUSIVE;
        ev.data.fd = listen_fd_;
        if (::epoll_ctl(loop->epoll_fd, EPOLL_CTL_ADD, listen_fd_, &ev) == 0) {
          loop->listening = true;
          loop->listen_paused_until_ms = 0;
        }
      }
    }
  }
  std::vector<Conn*> rest;
  for (auto& [fd, c] : loop->conns) rest.push_back(c.get());
  for (Conn* c : rest) Close(loop, c);
}

void EventServer::Accept(Loop* loop) {
  for (;;) {
    sockaddr_storage peer{};
    socklen_t peer_len = sizeof(peer);
    int fd = ::accept4(listen_fd_, reinterpret_cast<sockaddr*>(&peer), &peer_len,
                       SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
        // The listener stays readable: stop watching it for a while rather than spin.
        ::epoll_ctl(loop->epoll_fd, EPOLL_CTL_DEL, listen_fd_, nullptr);
        loop->listening = false;
        loop->listen_paused_until_ms = NowMs() + 100;
      }
      return;  // EAGAIN: another loop took it
    }
    const int64_t now = NowMs();
    auto c = std::make_unique<Conn>();
    c->fd = fd;
    c->id = next_conn_id_.fetch_add(1);
    c->loop = loop;
    c->client = ClientKey(peer);
    c->last_progress_ms = now;
    c->head_deadline_ms = now + options_.header_timeout_ms;  // the first head, from the accept
    SetPhase(c.get(), kIdle, now);
    Loop* victim_loop = nullptr;
    int victim_fd = -1;
    uint64_t victim_id = 0;
    if (!Admit(c.get(), &victim_loop, &victim_fd, &victim_id)) {
      // Every connection in the budget is busy: turned away with a 503 to its first request;
      // bounded too: past a second limit of the same size, closed at once.
      metrics_->connections_rejected.fetch_add(1);
      if (rejected_.load() >= options_.max_connections) {
        ::close(fd);
        continue;
      }
      c->rejecting = true;
      rejected_.fetch_add(1);
    } else {
      metrics_->connections_open.fetch_add(1);
    }
    int one = 1;
    ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    epoll_event ev{};
    ev.events = EPOLLIN | EPOLLOUT | EPOLLRDHUP | EPOLLET;
    ev.data.fd = fd;
    Conn* raw = c.get();
    loop->conns.emplace(fd, std::move(c));
    if (::epoll_ctl(loop->epoll_fd, EPOLL_CTL_ADD, fd, &ev) != 0) Close(loop, raw);
    if (victim_loop == loop) {
      Evict(loop, victim_fd, victim_id);
    } else if (victim_loop != nullptr) {
      {
        std::lock_guard<std::mutex> lock(victim_loop->done_mu);
        victim_loop->evictions.push_back({victim_fd, victim_id});
      }
      uint64_t wake = 1;
      ssize_t n = ::write(victim_loop->wake_fd, &wake, sizeof(wake));
      (void)n;
    }
  }
}

bool EventServer::Admit(Conn* c, Loop** victim_loop, int* victim_fd, uint64_t* victim_id) {
  std::lock_guard<std::mutex> lock(budget_mu_);
  // The cheapest connection to lose (see the header): lowest phase, then oldest in it.
  auto pick = [this](const std::string* client) -> Conn* {
    Conn* best = nullptr;
    int best_phase = kActive;
    int64_t best_since = 0;
    for (Conn* x : admitted_) {
      if (client != nullptr && x->client != *client) continue;
      const int phase = x->phase.load(std::memory_order_relaxed);
      const int64_t since = x->phase_since_ms.load(std::memory_order_relaxed);
      if (phase >= kActive) continue;
      if (best == nullptr || phase < best_phase || (phase == best_phase && since < best_since)) {
        best = x;
        best_phase = phase;
        best_since = since;
      }
    }
    return best;
  };
  auto held = per_client_.find(c->client);
  const size_t mine = held == per_client_.end() ? 0 : held->second;
  Conn* victim = nullptr;
  if (mine >= options_.max_connections_per_client) {
    victim = pick(&c->client);
    if (victim == nullptr) return false;
  } else if (admitted_.size() >= options_.max_connections) {
    victim = pick(nullptr);
    if (victim == nullptr) return false;
  }
  if (victim != nullptr) {
    *victim_loop = victim->loop;
    *victim_fd = victim->fd;
    *victim_id = victim->id;
    Unadmit(victim);
    metrics_->connections_evicted.fetch_add(1);
  }
  c->admitted = true;
  c->slot = admitted_.size();
  admitted_.push_back(c);
  ++per_client_[c->client];
  return true;
}

void EventServer::Unadmit(Conn* c) {
  Conn* last = admitted_.back();
  admitted_[c->slot] = last;
  last->slot = c->slot;
  admitted_.pop_back();
  auto it = per_client_.find(c->client);
  if (--it->second == 0) per_client_.erase(it);
  c->admitted = false;
}

void EventServer::Evict(Loop* loop, int fd, uint64_t id) {
  auto it = loop->conns.find(fd);
  if (it == loop->conns.end() || it->second->id != id) return;  // closed meanwhile
  Conn* c = it->second.get();
  if (c->busy || c->out_off < c->out.size()) {
    // Became active after it was chosen: its response goes out, then it closes.
    c->evict_pending = true;
    return;
  }
  Close(loop, c);
}

void EventServer::SetPhase(Conn* c, int phase, int64_t since_ms) {
  c->phase.store(phase, std::memory_order_relaxed);
  c->phase_since_ms.store(since_ms, std::memory_order_relaxed);
}

void EventServer::Close(Loop* loop, Conn* c) {
  // A reply still being produced: the client is gone, so its producer is told to stop.
  if (c->stream != nullptr) c->stream->Cancel();
  // The budget and the gauge are released before the socket closes: a client that sees the
  // close and connects again finds the place free (no eviction, no count above the budget).
  if (c->rejecting) {
    rejected_.fetch_sub(1);
  } else {
    metrics_->connections_open.fetch_sub(1);
    std::lock_guard<std::mutex> lock(budget_mu_);
    if (c->admitted) Unadmit(c);
  }
  ::epoll_ctl(loop->epoll_fd, EPOLL_CTL_DEL, c->fd, nullptr);
  ::close(c->fd);
  loop->conns.erase(c->fd);  // destroys *c
}

void EventServer::OnEvent(Loop* loop, Conn* c, uint32_t events) {
  if ((events & EPOLLERR) != 0) {
    Close(loop, c);
    return;
  }
  if ((events & EPOLLOUT) != 0 && c->out_off < c->out.size()) {
    if (!Flush(loop, c, /*then_process=*/true)) return;
  }
  if ((events & (EPOLLIN | EPOLLRDHUP | EPOLLHUP)) == 0) return;
  char buf[kReadChunk];
  const size_t bound = options_.max_header_bytes + options_.max_body_bytes + kReadChunk;
  const bool before_drain = !draining_.load();
  for (;;) {
    // Edge-triggered: read until EAGAIN, or until one request's worth is buffered (then
    // process it and come back for the rest).
    bool overfull = false;
    for (;;) {
      ssize_t n = ::recv(c->fd, buf, sizeof(buf), 0);
      if (n > 0) {
        c->last_progress_ms = NowMs();
        if (c->lingering) {
          c->lingered += static_cast<size_t>(n);
          if (c->lingered > kLingerBytes) {
            Close(loop, c);
            return;
          }
          continue;
        }
        if (c->in.empty() && c->parser == nullptr) c->in_before_drain = before_drain;
        c->in.append(buf, static_cast<size_t>(n));
        if (c->in.size() > bound) {
          overfull = true;
          break;
        }
        continue;
      }
      if (n == 0) {
        c->peer_closed = true;
      } else if (errno == EINTR) {
        continue;
      } else if (errno != EAGAIN && errno != EWOULDBLOCK) {
        Close(loop, c);
        return;
      }
      break;
    }
    if (c->lingering) {
      if (c->peer_closed) Close(loop, c);
      return;
    }
    if (!Process(loop, c)) return;
    if (!overfull) break;
    if (c->lingering) continue;  // answered with an error: drop the rest of the input
    if (c->in.size() > bound) {
      if (c->busy) {
        // Over a request's worth pipelined behind a call still being handled: cut it off.
        Close(loop, c);
        return;
      }
      // More than one request's worth and nothing could be answered.
      FailAndLinger(loop, c,
                    ErrorReply(413, "payload_too_large", "more request bytes than one request"));
      return;
    }
  }
  if (c->peer_closed && c->stream != nullptr) {
    // The client went away while its reply is being produced: cancelled, not finished.
    Close(loop, c);
    return;
  }
  if (c->peer_closed && !c->busy && c->out_off >= c->out.size()) Close(loop, c);
}

bool EventServer::Flush(Loop* loop, Conn* c, bool then_process) {
  while (c->out_off < c->out.size()) {
    ssize_t n = ::send(c->fd, c->out.data() + c->out_off, c->out.size() - c->out_off, MSG_NOSIGNAL);
    if (n > 0) {
      c->out_off += static_cast<size_t>(n);
      c->last_progress_ms = NowMs();
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return true;
    Close(loop, c);
    return false;
  }
  c->out.clear();
  c->out_off = 0;
  if (c->stream != nullptr) return true;  // more of a streamed reply to come
  if (c->close_after_write || (c->evict_pending && !c->busy)) {
    if (c->lingering && !c->peer_closed) {
      // Half-close so the client sees the response end; drop its input until it closes.
      ::shutdown(c->fd, SHUT_WR);
      c->linger_deadline_ms = NowMs() + kLingerMs;
      return true;
    }
    Close(loop, c);
    return false;
  }
  // The response is out: idle until the next request's first byte (unless this was the
  // interim 100 Continue of a request still arriving).
  if (!c->busy && c->parser == nullptr) SetPhase(c, kIdle, NowMs());
  // A pipelined request may be waiting in the buffer.
  if (then_process) {
    if (!Process(loop, c)) return false;
    if (c->peer_closed && !c->busy && c->out_off >= c->out.size()) {
      Close(loop, c);
      return false;
    }
  }
  return true;
}

void EventServer::Respond(Conn* c, const Reply& reply, bool head, bool close) {
  bool reply_closes = false;
  for (const auto& [k, v] : reply.headers) {
    if (absl::EqualsIgnoreCase(k, "Connection") && absl::EqualsIgnoreCase(v, "close")) {
      reply_closes = true;
    }
  }
  close = close || reply_closes || c->peer_closed || c->evict_pending;
  std::string& out = c->out;
  absl::StrAppend(&out, "HTTP/1.1 ", reply.status, " ", Reason(reply.status), "\r\n");
  absl::StrAppend(&out, "Content-Type: ", reply.content_type, "\r\n");
  const bool streamed = reply.stream != nullptr && !reply.stream->deferred();
  if (streamed) {
    absl::StrAppend(&out, "Transfer-Encoding: chunked\r\n");
  } else {
    absl::StrAppend(&out, "Content-Length: ", reply.body.size(), "\r\n");
  }
  for (const auto& [k, v] : reply.headers) {
    if (absl::EqualsIgnoreCase(k, "Connection")) continue;
    absl::StrAppend(&out, k, ": ", v, "\r\n");
  }
  absl::StrAppend(&out, "Cache-Control: no-store\r\nX-Content-Type-Options: nosniff\r\n");
  absl::StrAppend(&out, close ? "Connection: close\r\n\r\n" : "Connection: keep-alive\r\n\r\n");
  if (!head && !streamed) out.append(reply.body);
  c->close_after_write = close;
}

bool EventServer::FailAndLinger(Loop* loop, Conn* c, const Reply& reply) {
  metrics_->Observe("unmatched", "-", reply.status, 0);
  c->in.clear();
  c->parser.reset();
  c->lingering = true;
  SetPhase(c, kClosing, 0);
  Respond(c, reply, /*head=*/false, /*close=*/true);
  return Flush(loop, c, /*then_process=*/false);
}

bool EventServer::Process(Loop* loop, Conn* c) {
  while (!c->lingering && !c->busy && !c->evict_pending && c->out_off >= c->out.size() &&
         !c->in.empty()) {
    const int64_t now = NowMs();
    if (c->parser == nullptr) {
      c->parser =
          std::make_unique<RequestParser>(options_.max_header_bytes, options_.max_body_bytes);
      c->started_before_drain = c->in_before_drain;
      // A connection's first head is due header_timeout_ms after the accept; later ones after
      // their first byte.
      if (c->served > 0) c->head_deadline_ms = now + options_.header_timeout_ms;
      SetPhase(c, kHead, now);
    }
    RequestParser& parser = *c->parser;
    const RequestParser::State before = parser.state();
    c->in.erase(0, parser.Put(c->in));
    switch (parser.state()) {
      case RequestParser::State::kFailed: {
        const ParseError e = parser.error();
        return FailAndLinger(loop, c, ErrorReply(e.status, e.code, e.message));
      }
      case RequestParser::State::kHead:
        return true;  // wait for the rest of the head
      case RequestParser::State::kBody:
        if (before == RequestParser::State::kHead) {
          c->body_deadline_ms = now + options_.body_timeout_ms;
          SetPhase(c, kBody, now);
          if (parser.expect_continue() && !c->continue_sent) {
            c->continue_sent = true;
            c->out = "HTTP/1.1 100 Continue\r\n\r\n";
            c->out_off = 0;
            return Flush(loop, c, /*then_process=*/false);
          }
        }
        return true;  // wait for the rest of the body
      case RequestParser::State::kDone:
        break;
    }
    HttpRequest req = parser.TakeRequest();
    const bool keep_alive = parser.keep_alive();
    c->parser.reset();
    c->continue_sent = false;
    c->body_deadline_ms = 0;
    ++c->served;
    SetPhase(c, kActive, now);
    const bool draining = draining_.load();
    bool close =
        !keep_alive || c->served >= options_.keep_alive_max_requests || draining || c->rejecting;
    const bool head_only = req.method == "HEAD";
    Reply reply;
    if (c->rejecting) {
      reply = ErrorReply(503, "unavailable", "too many connections; retry later");
      reply.headers.emplace_back("Retry-After", "1");
      metrics_->Observe("unmatched", req.method, 503, 0);
    } else if (draining && !c->started_before_drain) {
      // Requests already started when the drain began finish; later ones are turned away.
      reply = ErrorReply(503, "unavailable", "server is shutting down");
      reply.headers.emplace_back("Retry-After", "1");
      metrics_->Observe("unmatched", req.method, 503, 0);
    } else if (req.method != "GET" && req.method != "HEAD") {
      // Mutating: a handler thread answers; Complete() writes the reply.
      Submit(handlers_.get(), loop, c, std::move(req), /*head=*/false, close);
      return true;
    } else if (readers_->size > 0 && options_.blocking(req)) {
      // A read that may block in file I/O: a reader thread answers, the loop serves the rest.
      Submit(readers_.get(), loop, c, std::move(req), head_only, close);
      return true;
    } else {
      reply = handler_(req);
    }
    if (!Answer(loop, c, reply, head_only, close, /*then_process=*/false)) return false;
    // Out in full: the loop takes the next pipelined request; else EPOLLOUT continues.
  }
  return true;
}

void EventServer::CheckDeadlines(Loop* loop) {
  const int64_t now = NowMs();
  std::vector<Conn*> expired;    // closed without a response
  std::vector<Conn*> timed_out;  // a head or body past its deadline: 408, then closed
  for (auto& [fd, c] : loop->conns) {
    if (c->busy) {
      // Its handler or producer is running: the request is not the client's to finish, but a
      // streamed reply the client does not read is closed after the write timeout.
      if (c->stream != nullptr && c->out_off < c->out.size() &&
          now - c->last_progress_ms >= options_.write_timeout_ms) {
        expired.push_back(c.get());
      }
      continue;
    }
    if (c->lingering && c->out_off >= c->out.size()) {
      if (now >= c->linger_deadline_ms) expired.push_back(c.get());
      continue;
    }
    if (c->out_off < c->out.size()) {
      if (now - c->last_progress_ms >= options_.write_timeout_ms) expired.push_back(c.get());
      continue;
    }
    const bool receiving = c->parser != nullptr || !c->in.empty();
    if (!receiving && c->served > 0) {
      // Idle between requests.
      if (now - c->last_progress_ms >= options_.keep_alive_timeout_ms) expired.push_back(c.get());
      continue;
    }
    if (now - c->last_progress_ms >= options_.read_timeout_ms) {
      expired.push_back(c.get());  // no progress at all
    } else if (!receiving) {
      // Accepted and silent: its first head is due header_timeout_ms after the accept.
      if (now >= c->head_deadline_ms) expired.push_back(c.get());
    } else if (c->body_deadline_ms != 0 ? now >= c->body_deadline_ms
                                        : now >= c->head_deadline_ms) {
      timed_out.push_back(c.get());
    }
  }
  for (Conn* c : expired) Close(loop, c);
  for (Conn* c : timed_out) {
    metrics_->requests_timed_out.fetch_add(1);
    const bool body = c->body_deadline_ms != 0;
    FailAndLinger(loop, c,
                  ErrorReply(408, "request_timeout",
                             body ? absl::StrCat("request body not received within ",
                                                 options_.body_timeout_ms, " ms")
                                  : absl::StrCat("request head not received within ",
                                                 options_.header_timeout_ms, " ms")));
  }
}

}  // namespace loradb::http
