// Scenario `serve`: serving through serving::CompletionService in-process (the layer the
// OpenAI-compatible routes sit on; the HTTP path is measured against these figures). A random
// base (--config, default compute/configs/bench-60m.json, fp32) and rank --rank adapters
// published in a store. Three cases:
//  - `throughput`: concurrent client threads, each a closed loop of --requests greedy
//    completions of --tokens tokens on random --prompt-token prompts; --clients clients each
//    naming its own adapter, versus the same clients all on the base; completion tokens/s over
//    the whole run (prefill included). Goal: distinct adapters >= 0.6x the base.
//  - `cliff`: a device arena of exactly --slots adapters; --cliff-clients such clients round-robin
//    over 1x, 2x and 4x --slots distinct adapters (all resident in the CPU tier); time to
//    first token (Submit to the first token callback) p50 / p99.
//    Goal: TTFT p50 and p99 at 4x the slots <= 3x those at 1x.
//  - `peft`: the peer a CPU user would otherwise pick. One greedy batch of --peft-rows rows,
//    each on its own adapter (random --prompt-token prompts, --tokens tokens), decoded by loradb
//    (every row submitted at once: CompletionService::SubmitBatch) and by transformers + peft in a
//    python3 child (bench/peft_generate.py: the same checkpoint, the same adapters exported from
//    the store as PEFT directories, `generate(..., adapter_names=[...])` per row), both sides at
//    each of --peft-threads LibTorch threads (default 1, then every core; loradb's LoRA kernels
//    share LibTorch's threads, the child calls torch.set_num_threads). Both sides warm up on the
//    batch first, then decode it --peft-rounds times; timed: the whole batch, prefill included;
//    reported: the median. The child checks that its greedy tokens equal loradb's (near-ties
//    aside), so both did the same work, and fails the case otherwise. Goal: loradb tokens/s >= 5x
//    at the last thread count (by default every core: LibTorch's default, which the peer and
//    `loradb serve` both run with). Skipped, with a note on stderr, when torch / transformers /
//    peft are not installed.
// The throughput and cliff cases run twice side by side on the same service: in-process (Complete)
// and through the HTTP endpoint (api/openai's POST /v1/completions on an in-process server over
// loopback, one keep-alive connection per client, `stream: true`, TTFT = the first token's event).
// Extra goals: HTTP base tokens/s >= 0.9x in-process at the same batch (the endpoint's overhead),
// and the distinct-vs-base and cliff goals over HTTP.
// Flags: --clients=N --cliff-clients=N --slots=N --requests=N --prompt=N --tokens=N --rank=N
// --peft-rows=N --peft-rounds=N --peft-threads=N,.. --threads=N (LibTorch intra-op threads of the
// throughput and cliff cases, which the LoRA kernels share) --config=PATH.
#if defined(LORADB_COMPUTE_AVAILABLE) && defined(LORADB_OPENAI_AVAILABLE)

#include <sys/socket.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <atomic>
#include <filesystem>
#include <fstream>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/blocking_counter.h"
#include "api/http/server.h"
#include "api/openai/completion_routes.h"
#include "bench/bench_util.h"
#include "compute/model/model_tools.h"
#include "compute/serving/completion_service.h"
#include "compute/serving/random_adapter.h"
#include "storage/store/store.h"

namespace loradb::bench {
namespace {

struct Options {
  std::string which = "all";  // throughput | cliff | peft | all
  int64_t clients = 64, cliff_clients = 32, slots = 8, requests = 2, prompt = 16, tokens = 16;
  int64_t rank = 16, threads = 1, peft_rows = 8, peft_rounds = 3;
  std::vector<int64_t> peft_threads;  // empty: 1, then every core
  std::string config = std::string(LORADB_SOURCE_DIR) + "/compute/configs/bench-60m.json";
};

absl::Status ParseArgs(const std::vector<std::string>& args, Options* o) {
  CLI::App app("serve: completions from many adapters, in-process and over HTTP", "serve");
  app.add_option("case", o->which, "throughput, cliff, peft or all")
      ->check(CLI::IsMember({"throughput", "cliff", "peft", "all"}));
  app.add_option("--clients", o->clients, "concurrent clients")->check(CLI::PositiveNumber);
  app.add_option("--cliff-clients", o->cliff_clients, "cliff: concurrent clients")
      ->check(CLI::PositiveNumber);
  app.add_option("--slots", o->slots, "cliff: device slots")->check(CLI::PositiveNumber);
  app.add_option("--requests", o->requests, "requests per client")->check(CLI::PositiveNumber);
  app.add_option("--prompt", o->prompt, "prompt tokens")->check(CLI::PositiveNumber);
  app.add_option("--tokens", o->tokens, "completion tokens")->check(CLI::PositiveNumber);
  app.add_option("--rank", o->rank, "LoRA rank")->check(CLI::PositiveNumber);
  app.add_option("--peft-rows", o->peft_rows, "peft: batch rows, one adapter each")
      ->check(CLI::PositiveNumber);
  app.add_option("--peft-rounds", o->peft_rounds, "peft: timed batches per side (median)")
      ->check(CLI::PositiveNumber);
  app.add_option("--threads", o->threads, "LibTorch threads (the LoRA kernels share them)")
      ->check(CLI::PositiveNumber);
  app.add_option("--peft-threads", o->peft_threads,
                 "peft: thread counts both sides run at, comma-separated (default 1 and every "
                 "core; the goal line is the last's)")
      ->delimiter(',')
      ->check(CLI::PositiveNumber);
  app.add_option("--config", o->config, "model config (JSON)");
  return ParseFlags(&app, args);
}

// --peft-threads, or 1 and then the machine's cores (just 1 on a one-core machine).
std::vector<int64_t> PeftThreads(const Options& o) {
  if (!o.peft_threads.empty()) return o.peft_threads;
  const auto cores = static_cast<int64_t>(std::max(1u, std::thread::hardware_concurrency()));
  return cores > 1 ? std::vector<int64_t>{1, cores} : std::vector<int64_t>{1};
}

struct RunFigures {
  int64_t completion_tokens = 0;
  double seconds = 0;
  std::vector<double> ttft_ms;
  std::vector<double> latency_ms;
  serving::ServiceStats stats;
  double tokens_per_s() const {
    return seconds > 0 ? static_cast<double>(completion_tokens) / seconds : 0;
  }
};

// A blocking keep-alive connection to the loopback endpoint, speaking just enough HTTP for the
// streamed completions this scenario sends.
class HttpClient {
 public:
  explicit HttpClient(int port) : port_(port) {}
  ~HttpClient() {
    if (fd_ >= 0) ::close(fd_);
  }
  HttpClient(const HttpClient&) = delete;
  HttpClient& operator=(const HttpClient&) = delete;

  // POSTs a streamed completion; sets *first_token to the time its first token event arrived
  // and returns the number of token events. Errors: Unavailable on a connection failure,
  // Internal with the response on a non-200 status.
  absl::StatusOr<int64_t> Stream(const std::string& model, const std::vector<int64_t>& prompt,
                                 int64_t max_tokens, double* first_token) {
    if (fd_ < 0 && !Connect()) return absl::UnavailableError("serve bench: cannot connect");
    nlohmann::json body = {{"model", model},   {"prompt", prompt}, {"max_tokens", max_tokens},
                           {"temperature", 0}, {"stream", true},   {"return_token_ids", true}};
    const std::string b = body.dump();
    const std::string req = absl::StrCat(
        "POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        "Content-Length: ",
        b.size(), "\r\n\r\n", b);
    for (size_t off = 0; off < req.size();) {
      ssize_t n = ::send(fd_, req.data() + off, req.size() - off, MSG_NOSIGNAL);
      if (n <= 0) return absl::UnavailableError("serve bench: send failed");
      off += static_cast<size_t>(n);
    }
    std::string buf;
    char chunk[16384];
    int64_t tokens = 0;
    size_t next = 0;  // where the next token mark may start
    static constexpr char kTokenMark[] = "\"token_ids\":[";
    static constexpr size_t kMarkLen = sizeof(kTokenMark) - 1;
    static constexpr char kEnd[] = "data: [DONE]\n\n\r\n0\r\n\r\n";
    for (;;) {
      ssize_t n = ::recv(fd_, chunk, sizeof(chunk), 0);
      if (n <= 0) return absl::UnavailableError("serve bench: connection closed mid-response");
      buf.append(chunk, static_cast<size_t>(n));
      if (!absl::StartsWith(buf, "HTTP/1.1 200") && buf.find("\r\n\r\n") != std::string::npos) {
        return absl::InternalError(absl::StrCat("serve bench: ", buf.substr(0, 400)));
      }
      for (size_t at = buf.find(kTokenMark, next); at != std::string::npos;
           at = buf.find(kTokenMark, at + 1)) {
        if (tokens++ == 0) *first_token = NowSeconds();
        next = at + 1;
      }
      next = std::max(next, buf.size() >= kMarkLen ? buf.size() - kMarkLen + 1 : size_t{0});
      if (absl::EndsWith(buf, kEnd)) return tokens;
    }
  }

 private:
  bool Connect() {
    fd_ = ConnectLoopback(port_);
    return fd_ >= 0;
  }
  int port_;
  int fd_ = -1;
};

// The service behind an HTTP endpoint on a loopback ephemeral port (api/openai's routes).
class Endpoint {
 public:
  static absl::StatusOr<std::unique_ptr<Endpoint>> Start(
      std::shared_ptr<serving::CompletionService> svc, int64_t clients) {
    http::ServerOptions so;
    so.host = "127.0.0.1";
    so.port = 0;
    so.max_connections = static_cast<int>(clients) + 16;
    so.max_connections_per_client = static_cast<int>(clients) + 16;
    so.read_timeout_ms = 600'000;
    so.write_timeout_ms = 600'000;
    so.keep_alive_timeout_s = 600;
    absl::StatusOr<std::unique_ptr<http::Server>> server = http::Server::Create(so);
    if (!server.ok()) return server.status();
    auto e = std::unique_ptr<Endpoint>(new Endpoint());
    e->server_ = std::move(*server);
    absl::Status st = openai::AddCompletionRoutes(std::move(svc), {}, e->server_.get());
    if (st.ok()) st = e->server_->Bind();
    if (!st.ok()) return st;
    e->thread_ = std::thread([s = e->server_.get()] { s->Serve().IgnoreError(); });
    return e;
  }
  ~Endpoint() {
    server_->Shutdown();
    thread_.join();
  }
  int port() const { return server_->port(); }

 private:
  Endpoint() = default;
  std::unique_ptr<http::Server> server_;
  std::thread thread_;
};

std::vector<int64_t> RandomPrompt(std::mt19937_64& rng, int64_t length, int64_t vocab) {
  std::vector<int64_t> prompt(static_cast<size_t>(length));
  for (int64_t& t : prompt) t = static_cast<int64_t>(rng() % static_cast<uint64_t>(vocab));
  return prompt;
}

// `clients` threads, client i naming models[i % models.size()], each running `o.requests`
// completions one after another: in-process (http_port 0) or through the endpoint on
// `http_port` (one keep-alive connection per client).
absl::StatusOr<RunFigures> RunClients(serving::CompletionService& svc, const Options& o,
                                      int64_t clients, const std::vector<std::string>& models,
                                      uint64_t prompt_seed, int http_port = 0) {
  RunFigures f;
  std::mutex mu;
  absl::Status first_error;
  std::atomic<int64_t> tokens{0};
  const serving::ServiceStats before = svc.stats();
  const double t0 = NowSeconds();
  std::vector<std::thread> threads;
  for (int64_t c = 0; c < clients; ++c) {
    threads.emplace_back([&, c] {
      std::mt19937_64 rng(prompt_seed * 1000003 + static_cast<uint64_t>(c));
      std::unique_ptr<HttpClient> http;
      if (http_port != 0) http = std::make_unique<HttpClient>(http_port);
      for (int64_t r = 0; r < o.requests; ++r) {
        serving::CompletionRequest req;
        req.model = models[static_cast<size_t>(c) % models.size()];
        req.prompt = RandomPrompt(rng, o.prompt, svc.vocab_size());
        req.max_tokens = o.tokens;
        req.temperature = 0;
        if (http != nullptr) {
          const double start = NowSeconds();
          double first = start;
          absl::StatusOr<int64_t> n = http->Stream(req.model.empty() ? svc.base_name() : req.model,
                                                   req.prompt, o.tokens, &first);
          const double end = NowSeconds();
          std::lock_guard<std::mutex> lock(mu);
          if (!n.ok()) {
            if (first_error.ok()) first_error = n.status();
            return;
          }
          tokens += *n;
          f.ttft_ms.push_back((first - start) * 1e3);
          f.latency_ms.push_back((end - start) * 1e3);
          continue;
        }
        const double start = NowSeconds();
        auto first = std::make_shared<std::atomic<double>>(0.0);
        req.on_token = [first](const serving::TokenEvent&) {
          double zero = 0;
          first->compare_exchange_strong(zero, NowSeconds());
        };
        absl::StatusOr<serving::CompletionResult> res = svc.Complete(std::move(req));
        const double end = NowSeconds();
        std::lock_guard<std::mutex> lock(mu);
        if (!res.ok() || !res->status.ok()) {
          if (first_error.ok()) first_error = res.ok() ? res->status : res.status();
          return;
        }
        tokens += res->usage.completion_tokens;
        f.ttft_ms.push_back((first->load() - start) * 1e3);
        f.latency_ms.push_back((end - start) * 1e3);
      }
    });
  }
  for (std::thread& t : threads) t.join();
  f.seconds = NowSeconds() - t0;
  if (!first_error.ok()) return first_error;
  f.completion_tokens = tokens.load();
  const serving::ServiceStats after = svc.stats();
  f.stats.steps = after.steps - before.steps;
  f.stats.deferrals = after.deferrals - before.deferrals;
  f.stats.prefill_tokens = after.prefill_tokens - before.prefill_tokens;
  f.stats.decode_tokens = after.decode_tokens - before.decode_tokens;
  return f;
}

nlohmann::json Line(const Options& o, const std::string& name, int64_t clients, int64_t adapters,
                    const RunFigures& f, bool http = false) {
  return {{"bench", "serve"},
          {"case", http ? name + "_http" : name},
          {"path", http ? "http" : "in_process"},
          {"clients", clients},
          {"adapters", adapters},
          {"requests_per_client", o.requests},
          {"prompt_tokens", o.prompt},
          {"max_tokens", o.tokens},
          {"rank", o.rank},
          {"threads", o.threads},
          {"completion_tokens", f.completion_tokens},
          {"seconds", f.seconds},
          {"tokens_per_s", f.tokens_per_s()},
          {"ttft_p50_ms", Quantile(f.ttft_ms, 0.5)},
          {"ttft_p99_ms", Quantile(f.ttft_ms, 0.99)},
          {"latency_p50_ms", Quantile(f.latency_ms, 0.5)},
          {"latency_p99_ms", Quantile(f.latency_ms, 0.99)},
          {"steps", f.stats.steps},
          {"deferrals", f.stats.deferrals}};
}

double Ratio(double a, double b) { return b > 0 ? a / b : 0; }

// The base checkpoint, the store and `adapters` published policies p0.. (alias prod).
struct Setup {
  std::string model_dir;
  std::unique_ptr<Store> store;
  std::vector<RevisionRecord> revisions;  // p0.. in order
  uint64_t adapter_bytes = 0;
  int64_t adapter_tensors = 0;
};

absl::StatusOr<Setup> MakeSetup(const Options& o, const std::string& dir, int64_t adapters) {
  Setup s;
  s.model_dir = dir + "/model";
  Progress(absl::StrCat("serve: random base from ", o.config, ", ", adapters, " adapters"));
  absl::StatusOr<Hash128> fp = model::InitRandomCheckpoint(o.config, s.model_dir, 1, "f32");
  if (!fp.ok()) return fp.status();
  absl::StatusOr<std::unique_ptr<Store>> store = Store::Open(dir + "/store");
  if (!store.ok()) return store.status();
  s.store = std::move(*store);
  absl::Status st = s.store
                        ->AddBaseFromConfig("bench", s.model_dir + "/config.json",
                                            s.model_dir + "/model.safetensors")
                        .status();
  if (!st.ok()) return st;
  for (int64_t i = 0; i < adapters; ++i) {
    serving::RandomAdapterSpec spec;
    spec.rank = o.rank;
    spec.alpha = static_cast<float>(2 * o.rank);
    spec.stddev = 0.02f;
    spec.seed = static_cast<uint64_t>(i + 1);
    absl::StatusOr<RevisionRecord> rev =
        serving::PublishRandomAdapter(*s.store, "bench", absl::StrCat("p", i), "prod", spec);
    if (!rev.ok()) return rev.status();
    s.revisions.push_back(*rev);
    if (i == 0) {
      absl::StatusOr<TensorSet> t = s.store->ReadTensors(*rev);
      if (!t.ok()) return t.status();
      for (const TensorView& v : t->tensors()) {
        s.adapter_bytes += v.nbytes;
        ++s.adapter_tensors;
      }
    }
  }
  return s;
}

absl::StatusOr<std::shared_ptr<serving::CompletionService>> NewService(
    const Options& o, const Setup& s, int64_t clients, uint64_t arena_bytes, uint64_t page_bytes,
    int64_t adapters) {
  serving::ServiceOptions so;
  so.model_dir = s.model_dir;
  so.max_running = clients;
  so.max_queued = clients;
  so.max_prefill_tokens = clients * o.prompt;
  so.torch_threads = static_cast<int>(o.threads);
  so.cpu_cache_bytes =
      (s.adapter_bytes + (1 << 20)) * static_cast<uint64_t>(adapters) + (uint64_t{64} << 20);
  so.device_arena_bytes = arena_bytes;
  so.device_page_bytes = page_bytes;
  absl::StatusOr<std::unique_ptr<serving::CompletionService>> svc =
      serving::CompletionService::Create(so, s.store.get());
  if (!svc.ok()) return svc.status();
  return std::shared_ptr<serving::CompletionService>(std::move(*svc));
}

std::vector<std::string> Models(int64_t adapters) {
  std::vector<std::string> m;
  for (int64_t i = 0; i < adapters; ++i) m.push_back(absl::StrCat("p", i, ":prod"));
  if (m.empty()) m.push_back("");
  return m;
}

absl::Status RunThroughput(const Options& o, const Setup& s) {
  absl::StatusOr<std::shared_ptr<serving::CompletionService>> svc = NewService(
      o, s, o.clients, (s.adapter_bytes + (1 << 20)) * o.clients + (64 << 20), 64 << 10, o.clients);
  if (!svc.ok()) return svc.status();
  absl::StatusOr<std::unique_ptr<Endpoint>> endpoint = Endpoint::Start(*svc, o.clients);
  if (!endpoint.ok()) return endpoint.status();
  const int port = (*endpoint)->port();
  // Warm-up: every adapter into the tiers once, so both cases measure steady serving.
  Progress("serve throughput: warm-up");
  absl::StatusOr<RunFigures> warm = RunClients(**svc, o, o.clients, Models(o.clients), 1);
  if (!warm.ok()) return warm.status();
  Progress(absl::StrCat("serve throughput: ", o.clients, " clients on the base"));
  absl::StatusOr<RunFigures> base = RunClients(**svc, o, o.clients, Models(0), 2);
  if (!base.ok()) return base.status();
  Progress(absl::StrCat("serve throughput: ", o.clients, " clients, distinct adapters"));
  absl::StatusOr<RunFigures> distinct = RunClients(**svc, o, o.clients, Models(o.clients), 3);
  if (!distinct.ok()) return distinct.status();
  Progress(absl::StrCat("serve throughput: ", o.clients, " HTTP clients on the base"));
  absl::StatusOr<RunFigures> base_http = RunClients(**svc, o, o.clients, Models(0), 2, port);
  if (!base_http.ok()) return base_http.status();
  Progress(absl::StrCat("serve throughput: ", o.clients, " HTTP clients, distinct adapters"));
  absl::StatusOr<RunFigures> distinct_http =
      RunClients(**svc, o, o.clients, Models(o.clients), 3, port);
  if (!distinct_http.ok()) return distinct_http.status();
  Emit(Line(o, "base", o.clients, 0, *base));
  Emit(Line(o, "distinct", o.clients, o.clients, *distinct));
  Emit(Line(o, "base", o.clients, 0, *base_http, true));
  Emit(Line(o, "distinct", o.clients, o.clients, *distinct_http, true));
  const double ratio = Ratio(distinct->tokens_per_s(), base->tokens_per_s());
  EmitGoal("serve", absl::StrCat("distinct_", o.clients, "_vs_base_tokens_per_s"), ratio, ">= 0.6",
           ratio >= 0.6);
  const double http_ratio = Ratio(distinct_http->tokens_per_s(), base_http->tokens_per_s());
  EmitGoal("serve", absl::StrCat("http_distinct_", o.clients, "_vs_base_tokens_per_s"), http_ratio,
           ">= 0.6", http_ratio >= 0.6);
  // The endpoint's overhead: the same base clients (same prompts, batch and tokens) through
  // HTTP versus in-process.
  const double overhead = Ratio(base_http->tokens_per_s(), base->tokens_per_s());
  EmitGoal("serve", absl::StrCat("http_vs_in_process_", o.clients, "_tokens_per_s"), overhead,
           ">= 0.9", overhead >= 0.9);
  return absl::OkStatus();
}

absl::Status RunCliff(const Options& o, const Setup& s) {
  // 256-byte pages: an adapter takes at most ceil(bytes / page) pages plus one per tensor
  // (chunk rounding), so the arena below holds `slots` adapters and, while slots * tensors
  // < bytes / page, not one more.
  constexpr uint64_t kPage = 256;
  const uint64_t per_adapter =
      (s.adapter_bytes + kPage - 1) / kPage + static_cast<uint64_t>(s.adapter_tensors);
  if (static_cast<uint64_t>(o.slots * s.adapter_tensors) >= s.adapter_bytes / kPage) {
    return absl::InvalidArgumentError("serve cliff: adapters too small to size the arena exactly");
  }
  const uint64_t arena = per_adapter * kPage * static_cast<uint64_t>(o.slots);
  std::vector<double> p50, p99, http_p50, http_p99;
  for (int64_t mult : {1, 2, 4}) {
    const int64_t adapters = o.slots * mult;
    absl::StatusOr<std::shared_ptr<serving::CompletionService>> svc =
        NewService(o, s, o.cliff_clients, arena, kPage, adapters);
    if (!svc.ok()) return svc.status();
    absl::StatusOr<std::unique_ptr<Endpoint>> endpoint = Endpoint::Start(*svc, o.cliff_clients);
    if (!endpoint.ok()) return endpoint.status();
    Progress(absl::StrCat("serve cliff: ", adapters, " adapters in ", o.slots, " slots, warm-up"));
    absl::StatusOr<RunFigures> warm = RunClients(**svc, o, adapters, Models(adapters), 10);
    if (!warm.ok()) return warm.status();
    Progress(absl::StrCat("serve cliff: ", adapters, " adapters in ", o.slots, " slots, ",
                          o.cliff_clients, " clients"));
    absl::StatusOr<RunFigures> f =
        RunClients(**svc, o, o.cliff_clients, Models(adapters), 11 + static_cast<uint64_t>(mult));
    if (!f.ok()) return f.status();
    nlohmann::json line = Line(o, absl::StrCat("cliff_", mult, "x"), o.cliff_clients, adapters, *f);
    line["slots"] = o.slots;
    line["arena_bytes"] = arena;
    Emit(line);
    p50.push_back(Quantile(f->ttft_ms, 0.5));
    p99.push_back(Quantile(f->ttft_ms, 0.99));
    absl::StatusOr<RunFigures> h =
        RunClients(**svc, o, o.cliff_clients, Models(adapters), 21 + static_cast<uint64_t>(mult),
                   (*endpoint)->port());
    if (!h.ok()) return h.status();
    nlohmann::json hline =
        Line(o, absl::StrCat("cliff_", mult, "x"), o.cliff_clients, adapters, *h, true);
    hline["slots"] = o.slots;
    hline["arena_bytes"] = arena;
    Emit(hline);
    http_p50.push_back(Quantile(h->ttft_ms, 0.5));
    http_p99.push_back(Quantile(h->ttft_ms, 0.99));
  }
  const double r50 = Ratio(p50[2], p50[0]), r99 = Ratio(p99[2], p99[0]);
  EmitGoal("serve", "ttft_p50_4x_slots_vs_1x", r50, "<= 3", r50 <= 3);
  EmitGoal("serve", "ttft_p99_4x_slots_vs_1x", r99, "<= 3", r99 <= 3);
  const double h50 = Ratio(http_p50[2], http_p50[0]), h99 = Ratio(http_p99[2], http_p99[0]);
  EmitGoal("serve", "http_ttft_p50_4x_slots_vs_1x", h50, "<= 3", h50 <= 3);
  EmitGoal("serve", "http_ttft_p99_4x_slots_vs_1x", h99, "<= 3", h99 <= 3);
  return absl::OkStatus();
}

// One greedy batch: row i names models[i] with prompts[i], every row submitted at once (one
// thread each, so they share the decoder's steps). Wall time over the whole batch and each
// row's tokens.
struct BatchRun {
  double seconds = 0;
  int64_t completion_tokens = 0;
  int64_t steps = 0;  // decoder steps the batch took
  std::vector<std::vector<int64_t>> tokens;
};

// One greedy batch, every row submitted at once (CompletionService::SubmitBatch, as the peer's
// generate call gets its whole batch); returns when the last row is done.
absl::StatusOr<BatchRun> RunBatch(serving::CompletionService& svc,
                                  const std::vector<std::string>& models,
                                  const std::vector<std::vector<int64_t>>& prompts,
                                  int64_t max_tokens) {
  BatchRun run;
  run.tokens.resize(prompts.size());
  std::vector<absl::Status> errors(prompts.size());
  absl::BlockingCounter left(static_cast<int>(prompts.size()));
  std::vector<serving::CompletionRequest> batch;
  for (size_t i = 0; i < prompts.size(); ++i) {
    serving::CompletionRequest& req = batch.emplace_back();
    req.model = models[i];
    req.prompt = prompts[i];
    req.max_tokens = max_tokens;
    req.temperature = 0;
    req.on_done = [&, i](serving::CompletionResult res) {
      if (res.status.ok()) {
        run.tokens[i] = std::move(res.choices[0].tokens);
      } else {
        errors[i] = res.status;
      }
      left.DecrementCount();
    };
  }
  const int64_t steps0 = svc.stats().steps;
  const double t0 = NowSeconds();
  absl::StatusOr<std::vector<uint64_t>> ids = svc.SubmitBatch(std::move(batch));
  if (!ids.ok()) return ids.status();
  left.Wait();
  run.seconds = NowSeconds() - t0;
  // The last request's callback runs inside its step; the step is counted once the gauges show
  // nothing running.
  while (svc.stats().running > 0) std::this_thread::yield();
  run.steps = svc.stats().steps - steps0;
  for (size_t i = 0; i < prompts.size(); ++i) {
    if (!errors[i].ok()) return errors[i];
    run.completion_tokens += static_cast<int64_t>(run.tokens[i].size());
  }
  return run;
}

// One greedy batch of --peft-rows rows, each on its own adapter, through loradb and through
// transformers + peft (bench/peft_generate.py says what it times and checks), both sides at
// `threads` LibTorch (and LoRA kernel) threads; `dir` holds the exported adapters and the batch's
// spec. Emits both sides' lines; returns loradb's tokens/s over the peer's, or nullopt when the
// peer is not installed.
absl::StatusOr<std::optional<double>> RunPeftPair(const Options& o, const Setup& s,
                                                  const std::filesystem::path& dir,
                                                  int64_t threads) {
  const int64_t rows = o.peft_rows;
  Options ot = o;
  ot.threads = threads;
  absl::StatusOr<std::shared_ptr<serving::CompletionService>> svc =
      NewService(ot, s, rows, (s.adapter_bytes + (1 << 20)) * rows + (64 << 20), 64 << 10, rows);
  if (!svc.ok()) return svc.status();
  const std::vector<std::string> models = Models(rows);
  std::mt19937_64 rng(41);
  std::vector<std::vector<int64_t>> prompts;
  for (int64_t i = 0; i < rows; ++i)
    prompts.push_back(RandomPrompt(rng, o.prompt, (*svc)->vocab_size()));
  Progress(absl::StrCat("serve peft: loradb, ", rows, " rows on ", rows, " adapters, ", threads,
                        " thread(s)"));
  absl::StatusOr<BatchRun> warm = RunBatch(**svc, models, prompts, 2);
  if (!warm.ok()) return warm.status();
  std::vector<double> our_seconds;
  absl::StatusOr<BatchRun> ours;
  for (int64_t round = 0; round < o.peft_rounds; ++round) {
    absl::StatusOr<BatchRun> run = RunBatch(**svc, models, prompts, o.tokens);
    if (!run.ok()) return run.status();
    if (ours.ok() && run->tokens != ours->tokens) {
      return absl::InternalError("serve peft: loradb's greedy tokens differ between rounds");
    }
    our_seconds.push_back(run->seconds);
    ours = *std::move(run);
  }
  Progress(absl::StrCat("serve peft: loradb ", Quantile(our_seconds, 0.5),
                        " s per batch (median of ", our_seconds.size(), "), ", ours->steps,
                        " decoder steps"));

  nlohmann::json spec = {{"model_dir", s.model_dir},
                         {"max_tokens", o.tokens},
                         {"threads", threads},
                         {"rounds", o.peft_rounds},
                         {"adapters", nlohmann::json::array()},
                         {"rows", nlohmann::json::array()}};
  for (int64_t i = 0; i < rows; ++i) {
    const std::string name = absl::StrCat("p", i);
    const std::string adapter_dir = (dir / name).string();
    if (!std::filesystem::exists(adapter_dir)) {  // exported by an earlier thread count
      absl::Status st = s.store->ExportPeftDir(s.revisions[static_cast<size_t>(i)], adapter_dir);
      if (!st.ok()) return st;
    }
    spec["adapters"].push_back({{"name", name}, {"dir", adapter_dir}});
    spec["rows"].push_back({{"adapter", name},
                            {"prompt", prompts[static_cast<size_t>(i)]},
                            {"tokens", ours->tokens[static_cast<size_t>(i)]}});
  }
  const std::string spec_path = (dir / absl::StrCat("spec-", threads, ".json")).string();
  std::ofstream(spec_path) << spec.dump();
  const std::string cmd =
      absl::StrCat("python3 '", SourceDir(), "/bench/peft_generate.py' '", spec_path, "'");
  Progress(
      absl::StrCat("serve peft: transformers + peft (python3 child), ", threads, " thread(s)"));
  absl::StatusOr<JsonCommandResult> peer = RunJsonCommand(cmd);
  if (!peer.ok()) return peer.status();
  if (peer->exit_status == 77) {
    Progress(
        "serve peft: skipped, torch / transformers / peft are not installed (tools/dev setup "
        "installs them)");
    return std::nullopt;
  }
  if (peer->exit_status != 0 || !peer->last_object.contains("tokens_per_s")) {
    return absl::InternalError(absl::StrCat(
        "serve peft: ", cmd, " failed (exit status ", peer->exit_status,
        "); transformers + peft did not reproduce loradb's batch, see its message above"));
  }
  const nlohmann::json& p = peer->last_object;
  nlohmann::json common = {
      {"bench", "serve"},       {"rows", rows},   {"adapters", rows},   {"prompt_tokens", o.prompt},
      {"max_tokens", o.tokens}, {"rank", o.rank}, {"threads", threads}, {"rounds", o.peft_rounds}};
  nlohmann::json a = common, b = common;
  a["case"] = "peft_batch_loradb";
  a["path"] = "in_process";
  a["completion_tokens"] = ours->completion_tokens;
  a["seconds"] = Quantile(our_seconds, 0.5);
  a["round_seconds"] = our_seconds;
  a["decoder_steps"] = ours->steps;
  const double our_tps =
      Ratio(static_cast<double>(ours->completion_tokens), a["seconds"].get<double>());
  a["tokens_per_s"] = our_tps;
  const double ratio = Ratio(our_tps, p["tokens_per_s"].get<double>());
  a["vs_peer"] = ratio;
  b["case"] = "peft_batch_transformers_peft";
  b["path"] = "transformers_peft";
  for (const char* key : {"completion_tokens", "seconds", "round_seconds", "tokens_per_s",
                          "tokens_compared", "rows_compared_whole", "near_ties", "versions"}) {
    b[key] = p.value(key, nlohmann::json());
  }
  Emit(a);
  Emit(b);
  return ratio;
}

// The pair at each of --peft-threads; the goal line is the last count's: by default every core,
// LibTorch's default thread count, which the peer and `loradb serve` both run with unless told
// otherwise. The one-thread pair before it is reported beside it.
absl::Status RunPeft(const Options& o, const Setup& s, const std::filesystem::path& dir) {
  double ratio = 0;
  for (int64_t threads : PeftThreads(o)) {
    absl::StatusOr<std::optional<double>> r = RunPeftPair(o, s, dir, threads);
    if (!r.ok()) return r.status();
    if (!r->has_value()) return absl::OkStatus();  // the peer is not installed
    ratio = **r;
  }
  EmitGoal("serve", "vs_transformers_peft", ratio, ">= 5", ratio >= 5);
  return absl::OkStatus();
}

absl::Status Run(const std::vector<std::string>& args) {
  Options o;
  absl::Status st = ParseArgs(args, &o);
  if (!st.ok()) return st;
  const ScopedBenchDir scratch("loradb-bench-serve");
  auto runs = [&o](const char* which) { return o.which == which || o.which == "all"; };
  const int64_t adapters =
      std::max({runs("throughput") ? o.clients : 0, runs("cliff") ? 4 * o.slots : 0,
                runs("peft") ? o.peft_rows : 0});
  absl::StatusOr<Setup> setup = MakeSetup(o, scratch.path().string(), adapters);
  absl::Status result = setup.status();
  if (result.ok()) {
    Emit({{"bench", "serve"},
          {"case", "setup"},
          {"adapter_bytes", setup->adapter_bytes},
          {"adapter_tensors", setup->adapter_tensors},
          {"adapters", adapters}});
  }
  if (result.ok() && runs("throughput")) result = RunThroughput(o, *setup);
  if (result.ok() && runs("cliff")) result = RunCliff(o, *setup);
  if (result.ok() && runs("peft")) {
    const std::filesystem::path peft_dir = scratch.path() / "peft";
    std::filesystem::create_directories(peft_dir);
    result = RunPeft(o, *setup, peft_dir);
  }
  return result;
}

LORADB_REGISTER_SCENARIO({"serve",
                          "serving through CompletionService, in-process and through the HTTP "
                          "endpoint: distinct adapters vs base tokens/s and HTTP overhead "
                          "(throughput) | TTFT at 1x/2x/4x adapters per device slot (cliff) | "
                          "a mixed-adapter batch vs transformers + peft (peft) | all",
                          Run,
                          {"all", "--clients=64", "--cliff-clients=32", "--slots=8", "--requests=2",
                           "--tokens=16"}});

}  // namespace
}  // namespace loradb::bench

#endif  // LORADB_COMPUTE_AVAILABLE && LORADB_OPENAI_AVAILABLE
