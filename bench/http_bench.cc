// loradb-bench http [--connections C] [--reads N] [--writes M] [--policies P]
//                   [--revisions-per-policy R] [--threads T]
// The HTTP admin endpoint under load, on a loopback ephemeral port in this process: a store with
// P x R small revisions, the server with T worker threads, and C client connections (one thread
// and one keep-alive connection each). Case "read": N requests per connection of
// GET /v1/revisions/{random id}. Case "alias-move": M requests per connection of
// PUT /v1/policies/{random policy}/aliases/serving (a durable catalog commit each). Reports
// throughput, p50/p99/max latency and errors (plus "read-1conn": the same reads on one
// connection, for the unqueued latency); goal lines: read p99 < 5 ms (64 connections), zero
// errors.
#ifdef LORADB_HTTP_AVAILABLE
#include <httplib.h>

#include <atomic>
#include <filesystem>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

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
  int threads = 64;
};

absl::StatusOr<HttpBenchArgs> ParseArgs(const std::vector<std::string>& args) {
  HttpBenchArgs a;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& f = args[i];
    if (i + 1 >= args.size()) return absl::InvalidArgumentError(absl::StrCat("missing value: ", f));
    int v = 0;
    if (!absl::SimpleAtoi(args[++i], &v) || v < 1) {
      return absl::InvalidArgumentError(absl::StrCat("bad value for ", f));
    }
    if (f == "--connections") {
      a.connections = v;
    } else if (f == "--reads") {
      a.reads = v;
    } else if (f == "--writes") {
      a.writes = v;
    } else if (f == "--policies") {
      a.policies = v;
    } else if (f == "--revisions-per-policy") {
      a.revisions_per_policy = v;
    } else if (f == "--threads") {
      a.threads = v;
    } else {
      return absl::InvalidArgumentError(absl::StrCat("unknown flag ", f));
    }
  }
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

// Runs `per_conn` requests on each of `connections` keep-alive connections at once.
// `make_request(rng, client)` performs one request and returns its HTTP status (or -1).
LoadResult RunLoad(int port, int connections, int per_conn,
                   const std::function<int(std::mt19937_64&, httplib::Client&)>& make_request) {
  std::vector<std::vector<double>> lat(static_cast<size_t>(connections));
  std::atomic<uint64_t> errors{0};
  std::atomic<int> ready{0};
  std::atomic<bool> go{false};
  std::vector<std::thread> threads;
  double start = 0;
  for (int c = 0; c < connections; ++c) {
    threads.emplace_back([&, c] {
      httplib::Client client("127.0.0.1", port);
      client.set_keep_alive(true);
      client.set_tcp_nodelay(true);
      client.set_connection_timeout(10);
      client.set_read_timeout(30);
      client.set_write_timeout(30);
      std::mt19937_64 rng(static_cast<uint64_t>(c) * 7919 + 1);
      // One warm-up request opens the connection before the clock starts.
      if (make_request(rng, client) != 200) errors.fetch_add(1);
      ready.fetch_add(1);
      while (!go.load()) std::this_thread::yield();
      auto& mine = lat[static_cast<size_t>(c)];
      mine.reserve(static_cast<size_t>(per_conn));
      for (int i = 0; i < per_conn; ++i) {
        double t0 = NowSeconds();
        int status = make_request(rng, client);
        mine.push_back((NowSeconds() - t0) * 1e3);
        if (status != 200 && errors.fetch_add(1) == 0) {
          Progress(absl::StrCat("first failed request: connection ", c, " request ", i, " after ",
                                NowSeconds() - t0, " s"));
        }
      }
    });
  }
  while (ready.load() < connections) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  start = NowSeconds();
  go.store(true);
  for (auto& t : threads) t.join();
  LoadResult r;
  r.seconds = NowSeconds() - start;
  r.errors = errors.load();
  for (auto& v : lat) r.latencies_ms.insert(r.latencies_ms.end(), v.begin(), v.end());
  return r;
}

void EmitLoad(const std::string& name, const HttpBenchArgs& a, const LoadResult& r,
              const std::string& endpoint) {
  double n = static_cast<double>(r.latencies_ms.size());
  Emit({{"bench", "http"},
        {"case", name},
        {"endpoint", endpoint},
        {"connections", a.connections},
        {"server_threads", a.threads},
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
  std::string tmpl = (std::filesystem::temp_directory_path() / "loradb-http-bench-XXXXXX").string();
  if (::mkdtemp(tmpl.data()) == nullptr) return absl::InternalError("mkdtemp failed");
  struct Cleanup {
    std::string dir;
    ~Cleanup() {
      std::error_code ec;
      std::filesystem::remove_all(dir, ec);
    }
  } cleanup{tmpl};

  Progress(absl::StrCat("seeding ", a.policies, " x ", a.revisions_per_policy, " revisions"));
  LORADB_ASSIGN_OR_RETURN(std::unique_ptr<Store> opened, Store::Open(tmpl + "/store"));
  std::shared_ptr<Store> store(std::move(opened));
  LORADB_ASSIGN_OR_RETURN(Seeded seeded, Seed(store.get(), a));

  http::ServerOptions options;
  options.host = "127.0.0.1";
  options.port = 0;
  options.token = kToken;
  options.worker_threads = a.threads;
  // The warm-up request of each connection can finish seconds before the clock starts (64
  // serialized durable commits under load); a 5 s keep-alive would close idle ones first and
  // their next request would fail with a read error.
  options.keep_alive_timeout_s = 60;
  LORADB_ASSIGN_OR_RETURN(std::unique_ptr<http::Server> server, http::Server::Create(options));
  LORADB_RETURN_IF_ERROR(http::AddStoreRoutes(store, server.get()));
  LORADB_RETURN_IF_ERROR(server->Bind());
  const int port = server->port();
  absl::Status serve_status;
  std::thread serve_thread([&] { serve_status = server->Serve(); });

  std::vector<uint64_t> all_ids;
  for (const auto& ids : seeded.revisions) all_ids.insert(all_ids.end(), ids.begin(), ids.end());

  auto read_one = [&](std::mt19937_64& rng, httplib::Client& client) {
    uint64_t id = all_ids[rng() % all_ids.size()];
    auto res = client.Get(absl::StrCat("/v1/revisions/", id).c_str());
    return res ? res->status : -1;
  };
  // One connection first: the latency of a request with nothing queued in front of it.
  Progress(absl::StrCat("read-1conn: 1 connection x ", a.reads, " requests"));
  LoadResult serial = RunLoad(port, 1, a.reads, read_one);
  HttpBenchArgs one = a;
  one.connections = 1;
  EmitLoad("read-1conn", one, serial, "GET /v1/revisions/{id}");
  Progress(absl::StrCat("read: ", a.connections, " connections x ", a.reads, " requests"));
  LoadResult reads = RunLoad(port, a.connections, a.reads, read_one);
  EmitLoad("read", a, reads, "GET /v1/revisions/{id}");

  std::atomic<bool> first_error{false};
  const httplib::Headers auth = {{"Authorization", absl::StrCat("Bearer ", kToken)}};
  Progress(absl::StrCat("alias-move: ", a.connections, " connections x ", a.writes, " requests"));
  LoadResult writes =
      RunLoad(port, a.connections, a.writes, [&](std::mt19937_64& rng, httplib::Client& client) {
        size_t p = rng() % seeded.policies.size();
        const auto& ids = seeded.revisions[p];
        std::string body =
            absl::StrCat("{\"revision\": ", ids[rng() % ids.size()], ", \"reason\": \"bench\"}");
        auto res = client.Put(
            absl::StrCat("/v1/policies/", PolicyPath(seeded.policies[p]), "/aliases/serving")
                .c_str(),
            auth, body, "application/json");
        if (!res && !first_error.exchange(true)) {
          Progress(absl::StrCat("first error: transport: ", httplib::to_string(res.error())));
        } else if (res && res->status != 200 && !first_error.exchange(true)) {
          Progress(absl::StrCat("first error: ", res->status, " ", res->body));
        }
        return res ? res->status : -1;
      });
  EmitLoad("alias-move", a, writes, "PUT /v1/policies/{policy}/aliases/{alias}");

  server->Shutdown();
  serve_thread.join();
  LORADB_RETURN_IF_ERROR(serve_status);

  const double read_p99 = Quantile(reads.latencies_ms, 0.99);
  EmitGoal("http", "read_p99_ms", read_p99, "< 5", read_p99 < 5.0);
  const double total_errors = static_cast<double>(serial.errors + reads.errors + writes.errors);
  EmitGoal("http", "errors", total_errors, "== 0", total_errors == 0);
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
