// loradb-bench http [--connections C] [--reads N] [--writes M] [--policies P]
//                   [--revisions-per-policy R] [--client-threads K]
// The HTTP admin endpoint under load, on a loopback ephemeral port in this process: a store with
// P x R small revisions and the event-loop engine over it. Load: C keep-alive connections, one
// request in flight each (closed loop), driven by an epoll load generator on K threads (as wrk
// does). Case "read": N requests per connection of GET /v1/revisions/{random id};
// "alias-move": M requests per connection of PUT /v1/policies/{random policy}/aliases/serving
// (a durable catalog commit each); "read-1conn": reads on one connection (the unqueued
// latency). Reports throughput, p50/p99/max latency and errors per case; goal lines: read p99
// < 5 ms (C connections), zero errors over every case.
#ifdef LORADB_HTTP_AVAILABLE
#include <fcntl.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <atomic>
#include <cerrno>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "api/http/server.h"
#include "api/http/store_routes.h"
#include "bench/bench_util.h"
#include "storage/store/store.h"
#include "storage/util/status_macros.h"

namespace loradb::bench {
namespace {

constexpr char kToken[] = "bench-token-0123456789abcdef";

struct HttpBenchArgs {
  int connections = 64;
  int reads = 300;  // per connection
  int writes = 20;  // per connection
  int policies = 16;
  int revisions_per_policy = 8;
  int client_threads = 1;    // threads of the epoll load generator
  int event_threads = 0;     // loop threads of the event engine (0: one per hardware thread)
  int rounds = 1;            // read case: rounds
  int handler_threads = 64;  // event engine: threads for mutating calls
};

absl::StatusOr<HttpBenchArgs> ParseArgs(const std::vector<std::string>& args) {
  HttpBenchArgs a;
  CLI::App app("http: the admin endpoint under concurrent reads and writes", "http");
  const auto positive = CLI::Range(1, 1 << 20);
  app.add_option("--connections", a.connections, "client connections")->check(positive);
  app.add_option("--reads", a.reads, "reads per connection")->check(positive);
  app.add_option("--writes", a.writes, "writes per connection")->check(positive);
  app.add_option("--policies", a.policies, "policies in the seeded store")->check(positive);
  app.add_option("--revisions-per-policy", a.revisions_per_policy, "revisions of each policy")
      ->check(positive);
  app.add_option("--client-threads", a.client_threads, "threads of the load generator")
      ->check(positive);
  app.add_option("--event-threads", a.event_threads,
                 "loop threads of the event engine (0: one per hardware thread)")
      ->check(CLI::Range(0, 1 << 20));
  app.add_option("--rounds", a.rounds, "rounds of the read case")->check(positive);
  app.add_option("--handler-threads", a.handler_threads, "threads for mutating calls")
      ->check(positive);
  LORADB_RETURN_IF_ERROR(ParseFlags(&app, args));
  return a;
}

struct Seeded {
  std::vector<std::string> policies;
  std::vector<std::vector<uint64_t>> revisions;  // per policy
};

absl::StatusOr<Seeded> Seed(Store* store, const HttpBenchArgs& a) {
  BaseRecord base;
  base.name = "bench-base";
  base.arch.family = "custom";
  base.modules.push_back({"layers.0.self_attn.q_proj", 16, 16});
  LORADB_RETURN_IF_ERROR(store->AddBase(base).status());
  Seeded s;
  std::vector<float> a_buf(2 * 16), b_buf(16 * 2);
  for (int p = 0; p < a.policies; ++p) {
    std::string name = absl::StrCat("bench/p", p);
    LORADB_RETURN_IF_ERROR(store->CreatePolicy(name, base.name).status());
    s.policies.push_back(name);
    s.revisions.emplace_back();
    for (int r = 0; r < a.revisions_per_policy; ++r) {
      for (size_t i = 0; i < a_buf.size(); ++i) a_buf[i] = static_cast<float>(p * 100 + r + i);
      for (size_t i = 0; i < b_buf.size(); ++i) b_buf[i] = static_cast<float>(p - r - i);
      TensorView ta, tb;
      ta.name = "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight";
      ta.shape = {2, 16};
      ta.data = reinterpret_cast<const std::byte*>(a_buf.data());
      ta.nbytes = a_buf.size() * sizeof(float);
      tb.name = "base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight";
      tb.shape = {16, 2};
      tb.data = reinterpret_cast<const std::byte*>(b_buf.data());
      tb.nbytes = b_buf.size() * sizeof(float);
      PublishOptions opts;
      if (r == 0) opts.alias = "serving";
      LORADB_ASSIGN_OR_RETURN(RevisionRecord rec, store->PublishTensors(name, {ta, tb}, opts));
      s.revisions.back().push_back(rec.id);
    }
  }
  return s;
}

std::string PolicyPath(const std::string& name) {
  std::string out;
  for (char c : name) {
    if (c == '/') {
      out += "%2F";
    } else {
      out.push_back(c);
    }
  }
  return out;
}

struct LoadResult {
  std::vector<double> latencies_ms;
  uint64_t errors = 0;
  double seconds = 0;
};

// A blocking round trip on `fd` (used for the untimed warm-up request of each connection).
// Returns the HTTP status or -1.
int BlockingRoundTrip(int fd, const std::string& request);

// Parses one complete response at the start of `buf`: its HTTP status and total length, or
// length 0 when it is not complete yet (-1 status: malformed).
struct ParsedResponse {
  int status = 0;
  size_t length = 0;
};
ParsedResponse ParseResponse(const std::string& buf) {
  ParsedResponse r;
  size_t end = buf.find("\r\n\r\n");
  if (end == std::string::npos) return r;
  int status = 0;
  if (buf.size() < 12 || buf.compare(0, 5, "HTTP/") != 0 ||
      !absl::SimpleAtoi(absl::string_view(buf).substr(9, 3), &status)) {
    r.status = -1;
    r.length = end + 4;
    return r;
  }
  size_t body = 0;
  std::string head = absl::AsciiStrToLower(absl::string_view(buf).substr(0, end));
  size_t cl = head.find("\r\ncontent-length:");
  if (cl != std::string::npos) {
    size_t v = cl + 17;
    size_t eol = head.find("\r\n", v);
    if (!absl::SimpleAtoi(absl::StripAsciiWhitespace(absl::string_view(head).substr(
                              v, eol == std::string::npos ? std::string::npos : eol - v)),
                          &body)) {
      r.status = -1;
      r.length = end + 4;
      return r;
    }
  }
  if (buf.size() < end + 4 + body) return r;
  r.status = status;
  r.length = end + 4 + body;
  return r;
}

int BlockingRoundTrip(int fd, const std::string& request) {
  size_t off = 0;
  while (off < request.size()) {
    ssize_t n = ::send(fd, request.data() + off, request.size() - off, MSG_NOSIGNAL);
    if (n <= 0) return -1;
    off += static_cast<size_t>(n);
  }
  std::string buf;
  char chunk[16384];
  for (;;) {
    ParsedResponse p = ParseResponse(buf);
    if (p.length > 0) return p.status;
    ssize_t n = ::recv(fd, chunk, sizeof(chunk), 0);
    if (n <= 0) return -1;
    buf.append(chunk, static_cast<size_t>(n));
  }
}

// The load generator in the style of wrk: `threads` threads, each driving its share of the
// `connections` non-blocking keep-alive connections with epoll, one request in flight per
// connection (closed loop). Unlike one client thread per connection, the generator itself adds
// little scheduling delay on a machine with few cores. `make_request(rng)` builds a raw request.
LoadResult RunEventLoad(int port, int connections, int per_conn, int threads,
                        const std::function<std::string(std::mt19937_64&)>& make_request) {
  struct Conn {
    int fd = -1;
    std::mt19937_64 rng;
    std::string out;
    size_t out_off = 0;
    std::string in;
    int done = 0;
    double t0 = 0;
    std::vector<double> lat;
  };
  std::vector<Conn> conns(static_cast<size_t>(connections));
  std::atomic<uint64_t> errors{0};
  for (int c = 0; c < connections; ++c) {
    Conn& k = conns[static_cast<size_t>(c)];
    k.rng.seed(static_cast<uint64_t>(c) * 7919 + 1);
    k.fd = ConnectLoopback(port);
    // One warm-up request opens the connection before the clock starts.
    if (k.fd < 0 || BlockingRoundTrip(k.fd, make_request(k.rng)) != 200) errors.fetch_add(1);
    if (k.fd >= 0) ::fcntl(k.fd, F_SETFL, ::fcntl(k.fd, F_GETFL) | O_NONBLOCK);
    k.lat.reserve(static_cast<size_t>(per_conn));
  }
  threads = std::max(1, std::min(threads, connections));
  auto drive = [&](int first, int last) {
    int ep = ::epoll_create1(EPOLL_CLOEXEC);
    int active = 0;
    auto send_next = [&](Conn& k) {
      k.out = make_request(k.rng);
      k.out_off = 0;
      k.t0 = NowSeconds();
    };
    auto flush = [&](Conn& k) -> bool {
      while (k.out_off < k.out.size()) {
        ssize_t n = ::send(k.fd, k.out.data() + k.out_off, k.out.size() - k.out_off, MSG_NOSIGNAL);
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return true;
        if (n <= 0) return false;
        k.out_off += static_cast<size_t>(n);
      }
      return true;
    };
    auto fail = [&](Conn& k) {
      errors.fetch_add(static_cast<uint64_t>(per_conn - k.done));
      ::epoll_ctl(ep, EPOLL_CTL_DEL, k.fd, nullptr);
      ::close(k.fd);
      k.fd = -1;
      --active;
    };
    for (int c = first; c < last; ++c) {
      Conn& k = conns[static_cast<size_t>(c)];
      if (k.fd < 0) {
        errors.fetch_add(static_cast<uint64_t>(per_conn));
        continue;
      }
      epoll_event ev{};
      ev.events = EPOLLIN | EPOLLOUT | EPOLLET;
      ev.data.u32 = static_cast<uint32_t>(c);
      ::epoll_ctl(ep, EPOLL_CTL_ADD, k.fd, &ev);
      ++active;
      send_next(k);
      if (!flush(k)) fail(k);
    }
    std::vector<epoll_event> events(256);
    char chunk[16384];
    while (active > 0) {
      int n = ::epoll_wait(ep, events.data(), static_cast<int>(events.size()), 1000);
      if (n < 0 && errno == EINTR) continue;
      for (int i = 0; i < n; ++i) {
        Conn& k = conns[events[static_cast<size_t>(i)].data.u32];
        if (k.fd < 0) continue;
        if ((events[static_cast<size_t>(i)].events & EPOLLOUT) != 0 && !flush(k)) {
          fail(k);
          continue;
        }
        bool closed = false;
        for (;;) {
          ssize_t r = ::recv(k.fd, chunk, sizeof(chunk), 0);
          if (r > 0) {
            k.in.append(chunk, static_cast<size_t>(r));
            continue;
          }
          if (r == 0 || (errno != EAGAIN && errno != EWOULDBLOCK)) closed = true;
          break;
        }
        for (;;) {
          ParsedResponse p = ParseResponse(k.in);
          if (p.length == 0) break;
          k.lat.push_back((NowSeconds() - k.t0) * 1e3);
          if (p.status != 200) errors.fetch_add(1);
          k.in.erase(0, p.length);
          if (++k.done == per_conn) break;
          send_next(k);
          if (!flush(k)) {
            closed = true;
            break;
          }
        }
        if (k.done == per_conn) {
          ::epoll_ctl(ep, EPOLL_CTL_DEL, k.fd, nullptr);
          --active;
          continue;
        }
        if (closed) fail(k);
      }
    }
    ::close(ep);
  };
  double start = NowSeconds();
  std::vector<std::thread> workers;
  for (int t = 0; t < threads; ++t) {
    int first = connections * t / threads, last = connections * (t + 1) / threads;
    workers.emplace_back(drive, first, last);
  }
  for (auto& w : workers) w.join();
  LoadResult r;
  r.seconds = NowSeconds() - start;
  r.errors = errors.load();
  for (auto& k : conns) {
    r.latencies_ms.insert(r.latencies_ms.end(), k.lat.begin(), k.lat.end());
    if (k.fd >= 0) ::close(k.fd);
  }
  return r;
}

void EmitLoad(const std::string& name, const HttpBenchArgs& a, const LoadResult& r,
              const std::string& endpoint, const std::string& engine, const std::string& client) {
  double n = static_cast<double>(r.latencies_ms.size());
  Emit({{"bench", "http"},
        {"case", name},
        {"endpoint", endpoint},
        {"connections", a.connections},
        {"engine", engine},
        {"client", client},
        {"requests", r.latencies_ms.size()},
        {"errors", r.errors},
        {"seconds", r.seconds},
        {"requests_per_s", r.seconds > 0 ? n / r.seconds : 0},
        {"p50_ms", Quantile(r.latencies_ms, 0.50)},
        {"p99_ms", Quantile(r.latencies_ms, 0.99)},
        {"max_ms", Quantile(r.latencies_ms, 1.0)}});
}

absl::Status RunHttpBench(const std::vector<std::string>& raw_args) {
  LORADB_ASSIGN_OR_RETURN(HttpBenchArgs a, ParseArgs(raw_args));
  const ScopedBenchDir scratch("loradb-http-bench");

  Progress(absl::StrCat("seeding ", a.policies, " x ", a.revisions_per_policy, " revisions"));
  LORADB_ASSIGN_OR_RETURN(std::unique_ptr<Store> opened,
                          Store::Open((scratch.path() / "store").string()));
  std::shared_ptr<Store> store(std::move(opened));
  LORADB_ASSIGN_OR_RETURN(Seeded seeded, Seed(store.get(), a));

  // The server over the store, on an ephemeral loopback port.
  http::ServerOptions options;
  options.event_threads = a.event_threads;
  options.handler_threads = a.handler_threads;
  options.host = "127.0.0.1";
  options.port = 0;
  options.token = kToken;
  // Every connection comes from 127.0.0.1: room for all of them, in the budget and per client.
  options.max_connections = std::max(128, a.connections + 64);
  options.max_connections_per_client = options.max_connections;
  // The warm-up request of each connection can finish seconds before the clock starts (64
  // serialized durable commits under load); a 5 s keep-alive would close idle ones first and
  // their next request would fail with a read error.
  options.keep_alive_timeout_s = 60;
  LORADB_ASSIGN_OR_RETURN(std::unique_ptr<http::Server> server, http::Server::Create(options));
  LORADB_RETURN_IF_ERROR(http::AddStoreRoutes(store, server.get()));
  LORADB_RETURN_IF_ERROR(server->Bind());
  absl::Status serve_status;
  std::thread serving([&] { serve_status = server->Serve(); });
  const int port = server->port();

  std::vector<uint64_t> all_ids;
  for (const auto& ids : seeded.revisions) all_ids.insert(all_ids.end(), ids.begin(), ids.end());

  auto read_raw = [&](std::mt19937_64& rng) {
    uint64_t id = all_ids[rng() % all_ids.size()];
    return absl::StrCat("GET /v1/revisions/", id, " HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n");
  };
  auto move_raw = [&](std::mt19937_64& rng) {
    size_t p = rng() % seeded.policies.size();
    const auto& ids = seeded.revisions[p];
    std::string body =
        absl::StrCat("{\"revision\": ", ids[rng() % ids.size()], ", \"reason\": \"bench\"}");
    return absl::StrCat(
        "PUT /v1/policies/", PolicyPath(seeded.policies[p]),
        "/aliases/serving HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer ", kToken,
        "\r\nContent-Type: application/json\r\nContent-Length: ", body.size(), "\r\n\r\n", body);
  };
  const std::string client = absl::StrCat("epoll x", a.client_threads);
  const std::string engine =
      absl::StrCat("event-loop x", a.event_threads > 0 ? absl::StrCat(a.event_threads) : "auto");
  const std::string kRead = "GET /v1/revisions/{id}";
  const std::string kMove = "PUT /v1/policies/{policy}/aliases/{alias}";
  uint64_t total_errors = 0;
  auto emit = [&](const std::string& name, int connections, const LoadResult& r,
                  const std::string& endpoint) {
    total_errors += r.errors;
    HttpBenchArgs shown = a;
    shown.connections = connections;
    EmitLoad(name, shown, r, endpoint, engine, client);
  };
  // One connection: the latency of a request with nothing queued in front of it.
  Progress(absl::StrCat("read-1conn: 1 connection x ", a.reads, " requests"));
  emit("read-1conn", 1, RunEventLoad(port, 1, a.reads, 1, read_raw), kRead);
  // The goal case: C connections from the epoll load generator (as wrk would), for --rounds
  // rounds (the machine's load drifts). The goal is judged on every sample.
  Progress(
      absl::StrCat("read: ", a.connections, " connections x ", a.reads, ", ", a.rounds, " rounds"));
  LoadResult reads;
  for (int round = 0; round < a.rounds; ++round) {
    LoadResult r = RunEventLoad(port, a.connections, a.reads, a.client_threads, read_raw);
    emit("read", a.connections, r, kRead);
    reads.latencies_ms.insert(reads.latencies_ms.end(), r.latencies_ms.begin(),
                              r.latencies_ms.end());
  }
  Progress(absl::StrCat("alias-move: ", a.connections, " connections x ", a.writes, " requests"));
  emit("alias-move", a.connections,
       RunEventLoad(port, a.connections, a.writes, a.client_threads, move_raw), kMove);

  server->Shutdown();
  serving.join();
  LORADB_RETURN_IF_ERROR(serve_status);

  const double read_p99 = Quantile(reads.latencies_ms, 0.99);
  EmitGoal("http", "read_p99_ms", read_p99, "< 5", read_p99 < 5.0);
  EmitGoal("http", "errors", static_cast<double>(total_errors), "== 0", total_errors == 0);
  return absl::OkStatus();
}

LORADB_REGISTER_SCENARIO({"http",
                          "HTTP admin endpoint: revision reads and alias moves under 64 "
                          "connections",
                          RunHttpBench,
                          {"--connections", "64", "--reads", "200", "--writes", "10"}});

}  // namespace
}  // namespace loradb::bench
#endif  // LORADB_HTTP_AVAILABLE
