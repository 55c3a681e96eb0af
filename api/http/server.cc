#include "api/http/server.h"

#include <arpa/inet.h>
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

struct Server::Impl {
  std::unique_ptr<EventServer> event;  // once bound
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

Server::~Server() = default;

absl::StatusOr<std::unique_ptr<Server>> Server::Create(ServerOptions options) {
  bool loopback = IsLoopbackHost(options.host);
  if (!loopback && options.token.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("refusing to listen on non-loopback address ",
                                                   options.host, " without --token-file"));
  }
  if (options.auth_reads && options.token.empty()) {
    return absl::InvalidArgumentError("--auth-reads needs --token-file");
  }
  if (options.max_connections < 1 || options.max_connections_per_client < 1 ||
      options.handler_threads < 1 || options.event_threads < 0 || options.blocking_threads < 0 ||
      options.read_timeout_ms < 1 || options.header_timeout_ms < 1 ||
      options.body_timeout_ms < 1 || options.write_timeout_ms < 1 || options.max_body_bytes < 1) {
    return absl::InvalidArgumentError("server limits must be positive");
  }
  if (options.max_header_bytes < 64 || options.max_header_bytes > (64 << 10)) {
    return absl::InvalidArgumentError("max_header_bytes must be 64 B .. 64 KiB");
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
  EventServerOptions eo;
  unsigned hw = std::thread::hardware_concurrency();
  eo.threads = options_.event_threads > 0
                   ? options_.event_threads
                   : static_cast<int>(std::clamp<unsigned>(hw == 0 ? 2 : hw, 2, 8));
  eo.handler_threads = options_.handler_threads;
  eo.blocking_threads = options_.blocking_threads;
  // Routes may still be added until Serve; MayBlock reads the table only once serving.
  eo.blocking = [this](const HttpRequest& req) { return router_.MayBlock(req.target); };
  eo.max_connections = static_cast<size_t>(options_.max_connections);
  eo.max_connections_per_client = static_cast<size_t>(options_.max_connections_per_client);
  eo.max_header_bytes = options_.max_header_bytes;
  eo.max_body_bytes = options_.max_body_bytes;
  eo.read_timeout_ms = options_.read_timeout_ms;
  eo.header_timeout_ms = options_.header_timeout_ms;
  eo.body_timeout_ms = options_.body_timeout_ms;
  eo.write_timeout_ms = options_.write_timeout_ms;
  eo.keep_alive_timeout_ms = options_.keep_alive_timeout_s * 1000;
  eo.keep_alive_max_requests = options_.keep_alive_max_requests;
  auto handler = [this](HttpRequest& req) -> Reply {
    auto start = std::chrono::steady_clock::now();
    std::string route = "unmatched";
    // HEAD is answered by the GET route (the engine leaves the body out).
    Reply reply = Dispatch(req.method == "HEAD" ? "GET" : req.method, req, &route);
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
    if (impl_->event == nullptr) {
      return absl::FailedPreconditionError("Serve called before a successful Bind");
    }
    impl_->serving = true;
  }
  impl_->event->Run();
  std::lock_guard<std::mutex> lock(impl_->drain_mu);
  impl_->serving = false;
  impl_->drain_cv.notify_all();
  return absl::OkStatus();
}

void Server::Shutdown() {
  draining_.store(true);
  auto deadline =
      std::chrono::steady_clock::now() + std::chrono::milliseconds(options_.drain_timeout_ms);
  // The loops stop accepting, close idle connections and finish the requests already started
  // (answering 503 to requests started later) until the deadline.
  if (impl_->event != nullptr) impl_->event->Drain(deadline);
  std::unique_lock<std::mutex> lock(impl_->drain_mu);
  impl_->drain_cv.wait(lock, [&] { return !impl_->serving; });
}

Reply Server::Dispatch(const std::string& method, HttpRequest& req, std::string* route_out) {
  const std::string& target = req.target;
  const std::string& host_header = req.host;
  const std::string& authorization = req.authorization;
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
  const bool api_key_auth = match->route->auth == Route::Auth::kApiKey;
  bool needs_auth =
      match->route->auth == Route::Auth::kBearerIfToken
          ? !options_.token.empty()
          : !api_key_auth && (IsMutating(method) ||
                              (options_.auth_reads && match->route->pattern != "/healthz"));
  if (api_key_auth && !options_.token.empty()) {
    // The key, or else a bearer token, must be the server's token.
    std::string key = req.api_key;
    const size_t space = authorization.find(' ');
    if (key.empty() && space != std::string::npos &&
        absl::EqualsIgnoreCase(absl::string_view(authorization).substr(0, space), "Bearer")) {
      const size_t token_start = authorization.find_first_not_of(' ', space);
      if (token_start != std::string::npos) key = authorization.substr(token_start);
    }
    if (key.empty()) return ErrorReply(401, "unauthenticated", "missing API key (X-API-Key)");
    if (!ConstantTimeEquals(key, options_.token)) {
      return ErrorReply(403, "permission_denied", "wrong API key");
    }
  }
  if (needs_auth) {
    if (options_.token.empty()) {
      return ErrorReply(401, "unauthenticated",
                        "mutating calls need the server to be started with --token-file");
    }
    // credentials = auth-scheme 1*SP token68; the scheme is case-insensitive (RFC 9110 11.1).
    const size_t space = authorization.find(' ');
    if (space == std::string::npos ||
        !absl::EqualsIgnoreCase(absl::string_view(authorization).substr(0, space), "Bearer")) {
      return ErrorReply(401, "unauthenticated", "missing bearer token (Authorization: Bearer ...)");
    }
    const size_t token_start = authorization.find_first_not_of(' ', space);
    if (token_start == std::string::npos ||
        !ConstantTimeEquals(authorization.substr(token_start), options_.token)) {
      return ErrorReply(403, "permission_denied", "wrong bearer token");
    }
  }
  Call call;
  call.method = method;
  call.route = match->route->pattern;
  call.params = std::move(match->params);
  call.query = std::move(req.query);
  call.body = std::move(req.body);
  call.content_type = std::move(req.content_type);
  call.content_encoding = std::move(req.content_encoding);
  call.accept = std::move(req.accept);
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
