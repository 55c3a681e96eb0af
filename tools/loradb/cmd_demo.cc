// `loradb demo [--dir DIR] [--seed N] [--quick]`: the end-to-end demo (compute/demo/demo.h),
// with the HTTP admin endpoint phase when the endpoint is built.
#include "tools/loradb/command.h"

#if defined(LORADB_COMPUTE_AVAILABLE)

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdio>
#include <memory>
#include <string>
#include <thread>

#include "absl/strings/str_cat.h"
#include "compute/demo/demo.h"
#include "storage/util/status_macros.h"

#if defined(LORADB_HTTP_AVAILABLE)
#include "api/http/server.h"
#include "api/http/store_routes.h"
#endif

namespace loradb::cli {
namespace {

struct DemoArgs {
  std::string dir = "var/demo";
  uint64_t seed = 0;
  bool quick = false;
};

#if defined(LORADB_HTTP_AVAILABLE)
// One HTTP/1.1 GET on 127.0.0.1:`port`; returns the status line and body.
absl::StatusOr<std::pair<std::string, std::string>> HttpGet(int port, const std::string& path) {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return absl::InternalError("socket failed");
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    ::close(fd);
    return absl::UnavailableError(absl::StrCat("cannot connect to 127.0.0.1:", port));
  }
  const std::string req =
      absl::StrCat("GET ", path, " HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n");
  if (::send(fd, req.data(), req.size(), MSG_NOSIGNAL) != static_cast<ssize_t>(req.size())) {
    ::close(fd);
    return absl::UnavailableError("send failed");
  }
  std::string resp;
  char buf[4096];
  for (ssize_t n; (n = ::recv(fd, buf, sizeof(buf), 0)) > 0;)
    resp.append(buf, static_cast<size_t>(n));
  ::close(fd);
  const size_t eol = resp.find("\r\n");
  const size_t body = resp.find("\r\n\r\n");
  if (eol == std::string::npos || body == std::string::npos) {
    return absl::InternalError(absl::StrCat("malformed HTTP response to GET ", path));
  }
  return std::make_pair(resp.substr(0, eol), resp.substr(body + 4));
}

// Phase 5: the admin endpoint on an ephemeral loopback port, queried like a user would.
absl::StatusOr<std::string> HttpPhase(Store* store) {
  http::ServerOptions so;
  so.port = 0;
  so.handler_threads = 4;
  LORADB_ASSIGN_OR_RETURN(std::unique_ptr<http::Server> server, http::Server::Create(so));
  // The demo keeps ownership of the store; the server is stopped before the demo returns.
  LORADB_RETURN_IF_ERROR(
      http::AddStoreRoutes(std::shared_ptr<Store>(store, [](Store*) {}), server.get()));
  LORADB_RETURN_IF_ERROR(server->Bind());
  const int port = server->port();
  absl::Status serve_status;
  std::thread serving([&] { serve_status = server->Serve(); });
  std::string report =
      absl::StrCat("http: admin endpoint served at http://127.0.0.1:", port, "/\n");
  absl::Status query_status;
  for (const char* path :
       {"/healthz", "/v1/policies", "/v1/policies/acme%2Flookup-a/aliases/serving/locate",
        "/v1/policies/acme%2Flookup-a/aliases/serving/history"}) {
    auto r = HttpGet(port, path);
    if (!r.ok()) {
      query_status = r.status();
      break;
    }
    std::string body = r->second;
    if (body.size() > 160) body = body.substr(0, 157) + "...";
    std::fprintf(stderr, "      GET %s -> %s\n        %s\n", path, r->first.c_str(), body.c_str());
    absl::StrAppend(&report, "  GET ", path, " -> ", r->first, "\n");
  }
  auto metrics = HttpGet(port, "/metrics");
  if (metrics.ok()) {
    absl::StrAppend(&report, "  GET /metrics -> ", metrics->first, " (", metrics->second.size(),
                    " bytes of Prometheus text)\n");
  }
  std::fprintf(
      stderr,
      "      try next (with `loradb --store %s serve`):\n"
      "        curl http://127.0.0.1:8080/v1/policies\n"
      "        curl http://127.0.0.1:8080/v1/policies/acme%%2Fmath/aliases/serving/locate\n"
      "        open http://127.0.0.1:8080/ in a browser for the status page\n",
      store->dir().c_str());
  server->Shutdown();
  serving.join();
  LORADB_RETURN_IF_ERROR(query_status);
  LORADB_RETURN_IF_ERROR(serve_status);
  absl::StrAppend(&report, "  endpoint stopped");
  return report;
}
#endif

absl::Status RunDemoCommand(const DemoArgs& args) {
  demo::DemoOptions o;
  o.dir = args.dir;
  o.seed = args.seed;
  o.quick = args.quick;
  o.progress = [](const std::string& line) { std::fprintf(stderr, "%s\n", line.c_str()); };
#if defined(LORADB_HTTP_AVAILABLE)
  o.http_phase = HttpPhase;
#endif
  LORADB_ASSIGN_OR_RETURN(demo::DemoResult r, demo::RunDemo(o));
  std::printf("\n%s", r.Summary().c_str());
  return absl::OkStatus();
}

void SetupDemo(CLI::App* sub, Invocation* inv) {
  auto args = std::make_shared<DemoArgs>();
  sub->add_option("--dir", args->dir, "demo directory (replaced if it holds an earlier demo)")
      ->capture_default_str();
  sub->add_option("--seed", args->seed, "seed of every random choice")->capture_default_str();
  sub->add_flag("--quick", args->quick, "shortened run (fewer training steps)");
  sub->callback([inv, args] { inv->run = [args] { return RunDemoCommand(*args); }; });
}

}  // namespace

LORADB_REGISTER_COMMAND("demo",
                        "end-to-end demo: train 4 policies on one base, serve them together, "
                        "roll back, query over HTTP",
                        SetupDemo);

}  // namespace loradb::cli

#endif  // LORADB_COMPUTE_AVAILABLE
