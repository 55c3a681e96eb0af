#include "api/http/server.h"

#include <arpa/inet.h>
#include <httplib.h>
#include <sys/socket.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <deque>
#include <fstream>
#include <mutex>
#include <thread>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "api/http/event_server.h"
#include "api/http/status_page.h"
#include "storage/util/status_macros.h"

namespace loradb::http {
namespace {

constexpr int kListenBacklog = 1024;

// Set on the threads that answer connections past the connection limit.
thread_local bool tls_rejecting = false;

bool IsMutating(const std::string& method) { return method != "GET" && method != "HEAD"; }

// Compares without an early exit, so the time taken does not reveal a matching prefix.
bool ConstantTimeEquals(const std::string& a, const std::string& b) {
  unsigned char diff = a.size() == b.size() ? 0 : 1;
  const std::string& ref = a.size() == b.size() ? b : a;
  for (size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned char>(a[i] ^ ref[i]);
  return diff == 0;
}

// Host header check against DNS rebinding: on a loopback listener only loopback names pass.
bool HostHeaderAllowed(const std::string& host_header) {
  if (host_header.empty()) return true;
  std::string host = host_header;
  if (host[0] == '[') {
    size_t end = host.find(']');
    if (end == std::string::npos) return false;
    host = host.substr(1, end - 1);
  } else {
    size_t colon = host.rfind(':');
    if (colon != std::string::npos) host = host.substr(0, colon);
  }
  return IsLoopbackHost(host);
}

}  // namespace

// A bounded connection pool for httplib: `workers` threads serve connections, at most
// `max_queued` accepted connections wait. Past that, connections go to `reject_threads` threads
// that answer every request with 503 (tls_rejecting); when those are also full, the accept loop
// blocks, leaving new connections in the kernel's listen backlog.
class ConnectionPool : public httplib::TaskQueue {
 public:
  ConnectionPool(size_t workers, size_t max_queued, size_t reject_threads, HttpMetrics* metrics)
      : max_queued_(max_queued), metrics_(metrics) {
    for (size_t i = 0; i < workers; ++i) threads_.emplace_back([this] { Work(false); });
    for (size_t i = 0; i < reject_threads; ++i) threads_.emplace_back([this] { Work(true); });
  }

  void enqueue(std::function<void()> fn) override {
    std::unique_lock<std::mutex> lock(mu_);
    for (;;) {
      if (shutdown_ || queue_.size() < max_queued_) {
        queue_.push_back(std::move(fn));
        work_cv_.notify_one();
        return;
      }
      if (reject_queue_.size() < max_queued_) {
        reject_queue_.push_back(std::move(fn));
        metrics_->connections_rejected.fetch_add(1);
        reject_cv_.notify_one();
        return;
      }
      space_cv_.wait(lock);
    }
  }

  void shutdown() override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      shutdown_ = true;
    }
    work_cv_.notify_all();
    reject_cv_.notify_all();
    space_cv_.notify_all();
    for (auto& t : threads_) t.join();
  }

 private:
  void Work(bool rejecting) {
    tls_rejecting = rejecting;
    auto& queue = rejecting ? reject_queue_ : queue_;
    auto& cv = rejecting ? reject_cv_ : work_cv_;
    for (;;) {
      std::function<void()> fn;
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv.wait(lock, [&] { return !queue.empty() || shutdown_; });
        if (queue.empty()) return;
        fn = std::move(queue.front());
        queue.pop_front();
      }
      space_cv_.notify_one();
      if (!rejecting) metrics_->connections_open.fetch_add(1);
      fn();
      if (!rejecting) metrics_->connections_open.fetch_sub(1);
    }
  }

  const size_t max_queued_;
  HttpMetrics* metrics_;
  std::mutex mu_;
  std::condition_variable work_cv_, reject_cv_, space_cv_;
  std::deque<std::function<void()>> queue_, reject_queue_;
  bool shutdown_ = false;
  std::vector<std::thread> threads_;
};

struct Server::Impl {
  httplib::Server svr;
  std::unique_ptr<EventServer> event;  // the kEventLoop engine, once bound
  std::mutex drain_mu;
  std::condition_variable drain_cv;
  bool serving = false;
};

absl::Status ParseListenAddress(const std::string& listen, std::string* host, int* port) {
  std::string h, p;
  if (!listen.empty() && listen[0] == '[') {
    size_t end = listen.find("]:");
    if (end == std::string::npos) {
      return absl::InvalidArgumentError(
          absl::StrCat("malformed listen address '", listen, "' (want [IPV6]:PORT)"));
    }
    h = listen.substr(1, end - 1);
    p = listen.substr(end + 2);
  } else {
    size_t colon = listen.rfind(':');
    if (colon == std::string::npos || listen.find(':') != colon) {
      return absl::InvalidArgumentError(
          absl::StrCat("malformed listen address '", listen, "' (want HOST:PORT)"));
    }
    h = listen.substr(0, colon);
    p = listen.substr(colon + 1);
  }
  int v = 0;
  if (h.empty() || !absl::SimpleAtoi(p, &v) || v < 0 || v > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("malformed listen address '", listen, "' (port must be 0..65535)"));
  }
  *host = h;
  *port = v;
  return absl::OkStatus();
}

bool IsLoopbackHost(const std::string& host) {
  if (absl::EqualsIgnoreCase(host, "localhost")) return true;
  in_addr a4{};
  if (inet_pton(AF_INET, host.c_str(), &a4) == 1) return (ntohl(a4.s_addr) >> 24) == 127;
  in6_addr a6{};
  if (inet_pton(AF_INET6, host.c_str(), &a6) == 1) return IN6_IS_ADDR_LOOPBACK(&a6);
  return false;
}

absl::StatusOr<std::string> ReadTokenFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read token file ", path));
  std::string line;
  std::getline(in, line);
  std::string token(absl::StripAsciiWhitespace(line));
  if (token.size() < 16) {
    return absl::InvalidArgumentError(
        absl::StrCat("token in ", path, " is shorter than 16 characters"));
  }
  for (char c : token) {
    if (static_cast<unsigned char>(c) < 0x21 || static_cast<unsigned char>(c) > 0x7e) {
      return absl::InvalidArgumentError(
          absl::StrCat("token in ", path, " must be printable ASCII without spaces"));
    }
  }
  return token;
}

Server::Server(ServerOptions options) : options_(std::move(options)), impl_(new Impl) {}

Server::~Server() {
  if (impl_->svr.is_running()) impl_->svr.stop();
}

absl::StatusOr<std::unique_ptr<Server>> Server::Create(ServerOptions options) {
  bool loopback = IsLoopbackHost(options.host);
  if (!loopback && options.token.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("refusing to listen on non-loopback address ",
                                                   options.host, " without --token-file"));
  }
  if (options.auth_reads && options.token.empty()) {
    return absl::InvalidArgumentError("--auth-reads needs --token-file");
  }
  if (options.worker_threads < 1 || options.max_queued_connections < 1 ||
      options.handler_threads < 1 || options.event_threads < 0 || options.blocking_threads < 0 ||
      options.reject_threads < 1 || options.read_timeout_ms < 1 || options.write_timeout_ms < 1 ||
      options.max_body_bytes < 1) {
    return absl::InvalidArgumentError("server limits must be positive");
  }
  std::unique_ptr<Server> server(new Server(std::move(options)));
  server->loopback_ = loopback;
  absl::Status st = server->AddSystemRoutes();
  if (!st.ok()) return st;
  return server;
}

void Server::AddMetricsSource(std::function<void(std::string*)> source) {
  metrics_sources_.push_back(std::move(source));
}

absl::Status Server::Bind() {
  if (options_.engine == ServerEngine::kEventLoop) return BindEventLoop();
  httplib::Server& svr = impl_->svr;
  svr.set_payload_max_length(options_.max_body_bytes);
  // Headers and body go out in separate writes; without TCP_NODELAY, Nagle + delayed ACK add
  // ~40 ms to every keep-alive response.
  svr.set_tcp_nodelay(true);
  svr.set_read_timeout(options_.read_timeout_ms / 1000, (options_.read_timeout_ms % 1000) * 1000);
  svr.set_write_timeout(options_.write_timeout_ms / 1000,
                        (options_.write_timeout_ms % 1000) * 1000);
  svr.set_keep_alive_timeout(options_.keep_alive_timeout_s);
  svr.set_keep_alive_max_count(static_cast<size_t>(options_.keep_alive_max_requests));
  HttpMetrics* metrics = &metrics_;
  const ServerOptions opts = options_;
  svr.new_task_queue = [metrics, opts] {
    return new ConnectionPool(static_cast<size_t>(opts.worker_threads),
                              static_cast<size_t>(opts.max_queued_connections),
                              static_cast<size_t>(opts.reject_threads), metrics);
  };
  auto handler = [this](const httplib::Request& req, httplib::Response& res) {
    double start =
        std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
    std::multimap<std::string, std::string> query(req.params.begin(), req.params.end());
    std::string route = "unmatched";
    Reply reply = Dispatch(req.method, req.target, req.get_header_value("Host"),
                           req.get_header_value("Authorization"), std::move(query), req.body,
                           req.get_header_value("Content-Type"), &route);
    res.status = reply.status;
    for (auto& [k, v] : reply.headers) res.set_header(k, v);
    res.set_header("Cache-Control", "no-store");
    res.set_header("X-Content-Type-Options", "nosniff");
    res.set_content(std::move(reply.body), reply.content_type.c_str());
    double end =
        std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
    metrics_.Observe(route, req.method, res.status, end - start);
  };
  // httplib 0.11 enforces payload_max_length only for Content-Length bodies, not chunked ones,
  // so chunked request bodies are refused before they are read (411: send Content-Length).
  svr.set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
    if (!req.has_header("Transfer-Encoding")) return httplib::Server::HandlerResponse::Unhandled;
    Reply r = ErrorReply(411, "length_required",
                         "chunked request bodies are not accepted; send Content-Length");
    r.headers.emplace_back("Connection", "close");
    res.status = r.status;
    for (auto& [k, v] : r.headers) res.set_header(k, v);
    res.set_content(r.body, r.content_type.c_str());
    metrics_.Observe("unmatched", req.method, r.status, 0);
    return httplib::Server::HandlerResponse::Handled;
  });
  svr.Get(".*", handler);
  svr.Post(".*", handler);
  svr.Put(".*", handler);
  svr.Patch(".*", handler);
  svr.Delete(".*", handler);
  // Responses httplib produces itself (413 body too large, 400 malformed request, 414 URI too
  // long) get the JSON error shape too.
  svr.set_error_handler([](const httplib::Request&, httplib::Response& res) {
    if (!res.body.empty()) return;
    std::string code = res.status == 413   ? "payload_too_large"
                       : res.status == 414 ? "uri_too_long"
                       : res.status == 431 ? "headers_too_large"
                       : res.status == 404 ? "not_found"
                                           : "bad_request";
    Reply r =
        ErrorReply(res.status, code,
                   absl::StrCat("request rejected by the HTTP layer (status ", res.status, ")"));
    res.set_content(r.body, r.content_type.c_str());
  });
  // The compiled cpp-httplib listens with a backlog of 5, too small for 64 clients connecting
  // at once; keep the listening socket's fd (the socket-options hook sees it) and listen again
  // with a larger backlog once bound.
  int listen_fd = -1;
  svr.set_socket_options([&listen_fd](socket_t sock) {
    httplib::default_socket_options(sock);
    listen_fd = sock;
  });
  int port = options_.port;
  if (port == 0) {
    port = svr.bind_to_any_port(options_.host);
    if (port < 0) {
      return absl::UnavailableError(absl::StrCat("cannot bind ", options_.host, ":0"));
    }
  } else if (!svr.bind_to_port(options_.host, port)) {
    return absl::UnavailableError(
        absl::StrCat("cannot bind ", options_.host, ":", port, " (in use or not permitted)"));
  }
  svr.set_socket_options(httplib::default_socket_options);  // drop the reference to listen_fd
  port_ = port;
  if (listen_fd >= 0 && ::listen(listen_fd, kListenBacklog) != 0) {
    return absl::InternalError(absl::StrCat("listen(backlog ", kListenBacklog, ") failed"));
  }
  return absl::OkStatus();
}

absl::Status Server::BindEventLoop() {
  EventServerOptions eo;
  unsigned hw = std::thread::hardware_concurrency();
  eo.threads = options_.event_threads > 0
                   ? options_.event_threads
                   : static_cast<int>(std::clamp<unsigned>(hw == 0 ? 2 : hw, 2, 8));
  eo.handler_threads = options_.handler_threads;
  eo.blocking_threads = options_.blocking_threads;
  // Routes may still be added until Serve; MayBlock reads the table only once serving.
  eo.blocking = [this](const HttpRequest& req) { return router_.MayBlock(req.target); };
  eo.max_connections = static_cast<size_t>(options_.worker_threads) +
                       static_cast<size_t>(options_.max_queued_connections);
  eo.max_header_bytes = options_.max_header_bytes;
  eo.max_body_bytes = options_.max_body_bytes;
  eo.read_timeout_ms = options_.read_timeout_ms;
  eo.write_timeout_ms = options_.write_timeout_ms;
  eo.keep_alive_timeout_ms = options_.keep_alive_timeout_s * 1000;
  eo.keep_alive_max_requests = options_.keep_alive_max_requests;
  auto handler = [this](HttpRequest& req) -> Reply {
    auto start = std::chrono::steady_clock::now();
    std::string route = "unmatched";
    // HEAD is answered by the GET route (the engine leaves the body out).
    Reply reply =
        Dispatch(req.method == "HEAD" ? "GET" : req.method, req.target, req.host, req.authorization,
                 std::move(req.query), std::move(req.body), std::move(req.content_type), &route);
    metrics_.Observe(
        route, req.method, reply.status,
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    return reply;
  };
  absl::StatusOr<std::unique_ptr<EventServer>> ev =
      EventServer::Bind(options_.host, options_.port, eo, &metrics_, std::move(handler));
  if (!ev.ok()) return ev.status();
  impl_->event = std::move(*ev);
  port_ = impl_->event->port();
  return absl::OkStatus();
}

absl::Status Server::Serve() {
  {
    std::lock_guard<std::mutex> lock(impl_->drain_mu);
    if (draining_.load()) return absl::OkStatus();
    impl_->serving = true;
  }
  if (options_.engine == ServerEngine::kEventLoop) {
    if (impl_->event == nullptr) {
      std::lock_guard<std::mutex> lock(impl_->drain_mu);
      impl_->serving = false;
      return absl::FailedPreconditionError("Serve called before a successful Bind");
    }
    impl_->event->Run();
    std::lock_guard<std::mutex> lock(impl_->drain_mu);
    impl_->serving = false;
    impl_->drain_cv.notify_all();
    return absl::OkStatus();
  }
  bool ok = impl_->svr.listen_after_bind();
  {
    std::lock_guard<std::mutex> lock(impl_->drain_mu);
    impl_->serving = false;
  }
  if (!ok && !draining_.load()) return absl::InternalError("HTTP server stopped unexpectedly");
  return absl::OkStatus();
}

void Server::Shutdown() {
  draining_.store(true);
  auto deadline =
      std::chrono::steady_clock::now() + std::chrono::milliseconds(options_.drain_timeout_ms);
  if (options_.engine == ServerEngine::kEventLoop) {
    // The loops stop accepting, close idle connections and finish the requests already
    // started (answering 503 to new ones on open connections) until the deadline.
    if (impl_->event != nullptr) impl_->event->Drain(deadline);
    std::unique_lock<std::mutex> lock(impl_->drain_mu);
    impl_->drain_cv.wait(lock, [&] { return !impl_->serving; });
    return;
  }
  {
    std::unique_lock<std::mutex> lock(impl_->drain_mu);
    impl_->drain_cv.wait_until(lock, deadline, [&] { return metrics_.in_flight.load() == 0; });
  }
  // Serve may be between its draining check and httplib's running flag; stop() is a no-op
  // until that flag is set, so keep stopping until Serve has returned.
  for (;;) {
    {
      std::lock_guard<std::mutex> lock(impl_->drain_mu);
      if (!impl_->serving) return;
    }
    if (impl_->svr.is_running()) impl_->svr.stop();
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

Reply Server::Dispatch(const std::string& method, const std::string& target,
                       const std::string& host_header, const std::string& authorization,
                       std::multimap<std::string, std::string> query, std::string body,
                       std::string content_type, std::string* route_out) {
  struct InFlight {
    Server* s;
    explicit InFlight(Server* server) : s(server) { s->metrics_.in_flight.fetch_add(1); }
    ~InFlight() {
      if (s->metrics_.in_flight.fetch_sub(1) == 1) {
        std::lock_guard<std::mutex> lock(s->impl_->drain_mu);
        s->impl_->drain_cv.notify_all();
      }
    }
  } in_flight(this);
  if (tls_rejecting) {
    Reply r = ErrorReply(503, "unavailable", "too many connections; retry later");
    r.headers.emplace_back("Retry-After", "1");
    r.headers.emplace_back("Connection", "close");
    return r;
  }
  if (draining_.load()) {
    Reply r = ErrorReply(503, "unavailable", "server is shutting down");
    r.headers.emplace_back("Retry-After", "1");
    r.headers.emplace_back("Connection", "close");
    return r;
  }
  if (loopback_ && !HostHeaderAllowed(host_header)) {
    return ErrorReply(403, "permission_denied",
                      "Host header must name a loopback address on a loopback listener");
  }
  absl::StatusOr<Match> match = router_.Resolve(method, target);
  if (!match.ok()) {
    if (IsMethodNotAllowed(match.status())) {
      return ErrorReply(405, "method_not_allowed",
                        absl::StrCat("method ", method, " is not allowed on this path"));
    }
    return ErrorReply(match.status());
  }
  *route_out = match->route->pattern;
  bool needs_auth =
      IsMutating(method) || (options_.auth_reads && match->route->pattern != "/healthz");
  if (needs_auth) {
    if (options_.token.empty()) {
      return ErrorReply(401, "unauthenticated",
                        "mutating calls need the server to be started with --token-file");
    }
    constexpr absl::string_view kBearer = "Bearer ";
    if (!absl::StartsWith(authorization, kBearer)) {
      return ErrorReply(401, "unauthenticated", "missing bearer token (Authorization: Bearer ...)");
    }
    if (!ConstantTimeEquals(authorization.substr(kBearer.size()), options_.token)) {
      return ErrorReply(403, "permission_denied", "wrong bearer token");
    }
  }
  Call call;
  call.method = method;
  call.route = match->route->pattern;
  call.params = std::move(match->params);
  call.query = std::move(query);
  call.body = std::move(body);
  call.content_type = std::move(content_type);
  for (const auto& [k, v] : call.query) {
    if (!IsValidUtf8(k) || !IsValidUtf8(v)) {
      return ErrorReply(400, "invalid_argument", "query string is not valid UTF-8");
    }
  }
  absl::StatusOr<Reply> reply = match->route->handler(call);
  if (!reply.ok()) return ErrorReply(reply.status());
  return *std::move(reply);
}

absl::Status Server::AddSystemRoutes() {
  using nlohmann::json;
  json health_schema = {{"type", "object"},
                        {"required", {"status"}},
                        {"properties", {{"status", {{"type", "string"}}}}}};
  LORADB_RETURN_IF_ERROR(router_.Add(MakeRoute(
      "GET", "/healthz",
      [](const Call&) -> absl::StatusOr<Reply> {
        return Reply::Json({{"status", "ok"}});
      },
      Operation("Liveness: 200 while the server accepts requests", "system",
                {{"200", ResponseSpec("alive", health_schema)}}))));
  LORADB_RETURN_IF_ERROR(router_.Add(MakeRoute(
      "GET", "/metrics",
      [this](const Call&) -> absl::StatusOr<Reply> {
        std::string out;
        metrics_.Render(&out);
        for (const auto& source : metrics_sources_) source(&out);
        return Reply::Text(std::move(out), "text/plain; version=0.0.4");
      },
      Operation("Metrics in the Prometheus text format", "system",
                {{"200", ResponseSpec("metrics", {{"type", "string"}}, "text/plain")}}))));
  LORADB_RETURN_IF_ERROR(router_.Add(MakeRoute(
      "GET", "/openapi.json",
      [this](const Call&) -> absl::StatusOr<Reply> {
        return Reply::Json(router_.OpenApi("loradb admin API", "1"));
      },
      Operation("This document (OpenAPI 3.1)", "system",
                {{"200", ResponseSpec("the OpenAPI document", {{"type", "object"}})}}))));
  return router_.Add(MakeRoute(
      "GET", "/",
      [](const Call&) -> absl::StatusOr<Reply> {
        return Reply::Text(StatusPageHtml(), "text/html; charset=utf-8");
      },
      Operation("Read-only status page (HTML + JS)", "system",
                {{"200", ResponseSpec("the page", {{"type", "string"}}, "text/html")}})));
}

}  // namespace loradb::http
