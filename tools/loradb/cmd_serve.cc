// `loradb serve`: the HTTP admin endpoint (api/http) over the store; with --model, also the
// OpenAI-compatible completions on a continuous-batching decoder (api/openai); with --model and
// --train, also the Tinker-compatible training and sampling API (api/tinker).
#ifdef LORADB_HTTP_AVAILABLE
#include <pthread.h>
#include <signal.h>
#include <sys/stat.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <memory>
#include <string>
#include <thread>

#include "absl/strings/str_cat.h"
#include "api/http/server.h"
#include "api/http/store_routes.h"
#include "api/http/tier_routes.h"
#include "storage/store/store.h"
#include "storage/store/store_tiers.h"
#include "tools/loradb/command.h"
#ifdef LORADB_OPENAI_AVAILABLE
#include "api/openai/completion_routes.h"
#include "compute/serving/completion_service.h"
#endif
#ifdef LORADB_TINKER_AVAILABLE
#include "api/tinker/tinker_routes.h"
#endif

namespace loradb::cli {
namespace {

// ---- `--train`: the Tinker-compatible training and sampling routes (api/tinker) over the base
// of `--model`.
struct TrainServeArgs {
  bool train = false;
  bool shared_batches = false;
  bool body_limit_given = false;  // --max-body-bytes was set explicitly
};

void AddTrainServeOptions(CLI::App* sub, TrainServeArgs* a) {
  sub->add_flag("--train", a->train,
                "also serve the Tinker training and sampling API (/api/v1/...) on --model's base");
  sub->add_flag("--train-shared-batches", a->shared_batches,
                "--train: run forward/backward calls of different runs queued together as one "
                "batch (for devices with idle capacity; on CPU they run one after another)");
}

// The SDK sends forward_backward chunks of up to 5 MB: without an explicit --max-body-bytes,
// --train raises the body limit to 64 MiB.
void ApplyTrainServeLimits(const TrainServeArgs& a, http::ServerOptions* options) {
  if (a.train && !a.body_limit_given) {
    options->max_body_bytes = std::max<size_t>(options->max_body_bytes, size_t{64} << 20);
  }
}

absl::Status AddTrainServeRoutes(const TrainServeArgs& a, const std::string& model,
                                 std::shared_ptr<Store> store, http::Server* server) {
  if (!a.train) return absl::OkStatus();
#ifdef LORADB_TINKER_AVAILABLE
  if (model.empty()) return absl::InvalidArgumentError("--train needs --model DIR");
  tinker::TinkerRoutesOptions options;
  options.model_dir = model;
  options.shared_batches = a.shared_batches;
  return tinker::AddTinkerRoutes(std::move(store), options, server);
#else
  (void)model;
  (void)store;
  (void)server;
  return absl::UnimplementedError(
      "--train: this loradb was built without the Tinker routes (needs LibTorch, protobuf, zstd)");
#endif
}
// ---- end of `--train`

struct ServeArgs {
  std::string listen = "127.0.0.1:8080";
  std::string token_file;
  bool auth_reads = false;
  size_t max_body_bytes = 1 << 20;
  int max_connections = 128;
  int max_connections_per_client = 64;
  int read_timeout_ms = 5000;
  int header_timeout_ms = 10000;
  int body_timeout_ms = 60000;
  uint64_t cpu_budget_bytes = uint64_t{1} << 30;
  std::string device = "none";
  uint64_t arena_bytes = uint64_t{256} << 20;
  // --model: the base checkpoint the decoder serves, and its serving limits.
  std::string model;
  std::string dtype;
  std::string served_model_name;
  int64_t max_running = 64;
  int64_t max_queued = 256;
  int64_t max_prefill_tokens = 4096;
  int threads = 0;
  TrainServeArgs train;
};

// The serving side of the endpoint: with --model, a decoder over the store's adapters and the
// OpenAI-compatible routes on `server`. `*keep` holds what must live while the server serves.
absl::Status AttachServing(const ServeArgs& args, const std::shared_ptr<Store>& store,
                           http::Server* server, std::shared_ptr<void>* keep) {
  if (args.model.empty()) return absl::OkStatus();
#ifdef LORADB_OPENAI_AVAILABLE
  serving::ServiceOptions o;
  o.model_dir = args.model;
  o.dtype = args.dtype;
  o.base_name = args.served_model_name;
  o.max_running = args.max_running;
  o.max_queued = args.max_queued;
  o.max_prefill_tokens = args.max_prefill_tokens;
  o.torch_threads = args.threads;
  absl::StatusOr<std::shared_ptr<serving::CompletionService>> service =
      openai::AttachModel(std::move(o), store, server);
  if (!service.ok()) {
    return absl::Status(service.status().code(),
                        absl::StrCat("--model ", args.model, ": ", service.status().message()));
  }
  std::fprintf(stderr, "loradb serve: serving %s as \"%s\" on /v1/completions\n",
               args.model.c_str(), (*service)->base_name().c_str());
  *keep = std::move(*service);
  return absl::OkStatus();
#else
  (void)store;
  (void)server;
  (void)keep;
  return absl::FailedPreconditionError(
      "--model needs a loradb built with LibTorch (this one has no decoder)");
#endif
}

absl::Status RunServe(const GlobalOptions& global, const ServeArgs& args) {
  // SIGTERM/SIGINT are handled by one thread with sigwait; block them before any other thread
  // (the tiers' loader and cache threads included) starts, so they are never delivered elsewhere.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  http::ServerOptions options;
  absl::Status st = http::ParseListenAddress(args.listen, &options.host, &options.port);
  if (!st.ok()) return st;
  if (!args.token_file.empty()) {
    absl::StatusOr<std::string> token = http::ReadTokenFile(args.token_file);
    if (!token.ok()) return token.status();
    options.token = *token;
    struct stat st_buf;
    if (::stat(args.token_file.c_str(), &st_buf) == 0 && (st_buf.st_mode & 077) != 0) {
      std::fprintf(stderr, "loradb serve: warning: token file %s is readable by group/others\n",
                   args.token_file.c_str());
    }
  }
  options.auth_reads = args.auth_reads;
  options.max_body_bytes = args.max_body_bytes;
  options.max_connections = args.max_connections;
  options.max_connections_per_client = args.max_connections_per_client;
  options.read_timeout_ms = args.read_timeout_ms;
  options.write_timeout_ms = args.read_timeout_ms;
  options.header_timeout_ms = args.header_timeout_ms;
  options.body_timeout_ms = args.body_timeout_ms;
  ApplyTrainServeLimits(args.train, &options);
  absl::StatusOr<std::unique_ptr<http::Server>> server = http::Server::Create(options);
  if (!server.ok()) return server.status();
  tiers::StoreTiersOptions tier_options;
  tier_options.cpu.budget_bytes = args.cpu_budget_bytes;
  tier_options.slots.arena_bytes = args.arena_bytes;
  if (args.device == "none") {
    tier_options.device = tiers::DeviceKind::kNone;
  } else if (args.device == "host") {
    tier_options.device = tiers::DeviceKind::kHost;
  } else if (args.device == "cuda") {
    tier_options.device = tiers::DeviceKind::kCuda;
  } else if (args.device == "auto") {
    tier_options.device = tiers::DeviceKind::kAuto;
  } else {
    return absl::InvalidArgumentError("--device must be none, host, cuda or auto");
  }
  StoreOptions store_options;
  store_options.create_if_missing = false;
  store_options.catalog.create_if_missing = false;
  // The Store owns the tiers, so the store routes' Locate and DELETE see residency too.
  store_options.tiers = tier_options;
  absl::StatusOr<std::unique_ptr<Store>> store = Store::Open(global.store, store_options);
  if (!store.ok()) {
    return absl::Status(store.status().code(),
                        absl::StrCat("cannot open store ", global.store, ": ",
                                     store.status().message(), " (run `loradb init` first)"));
  }
  std::shared_ptr<Store> shared_store(std::move(*store));
  st = http::AddStoreRoutes(shared_store, server->get());
  if (!st.ok()) return st;
  st = http::AddTierRoutes(shared_store, server->get());
  if (!st.ok()) return st;
  std::shared_ptr<void> serving_state;
  st = AttachServing(args, shared_store, server->get(), &serving_state);
  if (!st.ok()) return st;
  st = AddTrainServeRoutes(args.train, args.model, shared_store, server->get());
  if (!st.ok()) return st;

  st = (*server)->Bind();
  if (!st.ok()) return st;
  std::printf("listening on http://%s:%d\n",
              options.host.find(':') != std::string::npos ? ("[" + options.host + "]").c_str()
                                                          : options.host.c_str(),
              (*server)->port());
  std::fflush(stdout);

  http::Server* srv = server->get();
  std::atomic<bool> stopping{false};
  std::thread signal_thread([&] {
    int sig = 0;
    sigwait(&signals, &sig);
    if (stopping.exchange(true)) return;
    std::fprintf(stderr, "loradb serve: signal %d, draining\n", sig);
    srv->Shutdown();
  });
  absl::Status serve_status = srv->Serve();
  if (!stopping.exchange(true)) pthread_kill(signal_thread.native_handle(), SIGTERM);
  signal_thread.join();
  std::fprintf(stderr, "loradb serve: stopped\n");
  return serve_status;
}

void SetupServe(CLI::App* sub, Invocation* inv) {
  auto args = std::make_shared<ServeArgs>();
  sub->add_option("--listen", args->listen, "HOST:PORT to listen on (port 0: ephemeral)")
      ->capture_default_str();
  sub->add_option("--token-file", args->token_file,
                  "file holding the bearer token for mutating calls (required off loopback)");
  sub->add_flag("--auth-reads", args->auth_reads, "require the token for read calls as well");
  CLI::Option* max_body =
      sub->add_option("--max-body-bytes", args->max_body_bytes, "largest accepted request body")
          ->capture_default_str();
  sub->add_option("--max-connections", args->max_connections,
                  "open connections at once; past it an idle or unfinished connection is evicted, "
                  "or the new one gets 503 when all are busy")
      ->capture_default_str();
  sub->add_option("--max-connections-per-client", args->max_connections_per_client,
                  "open connections from one client address (evicting its own idle or "
                  "unfinished ones past it)")
      ->capture_default_str();
  sub->add_option("--read-timeout-ms", args->read_timeout_ms,
                  "a request (or response) making no progress for this long is closed")
      ->capture_default_str();
  sub->add_option("--header-timeout-ms", args->header_timeout_ms,
                  "deadline for a whole request head, from its first byte (408)")
      ->capture_default_str();
  sub->add_option("--body-timeout-ms", args->body_timeout_ms,
                  "deadline for a whole request body, from the end of its head (408)")
      ->capture_default_str();
  sub->add_option("--cpu-budget-bytes", args->cpu_budget_bytes, "CPU cache budget")
      ->capture_default_str();
  sub->add_option("--device", args->device, "device tier: none, host, cuda or auto")
      ->capture_default_str();
  sub->add_option("--arena-bytes", args->arena_bytes, "device tier arena size")
      ->capture_default_str();
  sub->add_option("--model", args->model,
                  "base checkpoint directory (config.json + safetensors, optional "
                  "tokenizer.json): also serve /v1/completions and /v1/models on it");
  sub->add_option("--dtype", args->dtype, "with --model: compute dtype f32 | bf16 | f16");
  sub->add_option("--served-model-name", args->served_model_name,
                  "with --model: the name the base answers to (default: the store's base with "
                  "the model's weights, else the directory name)");
  sub->add_option("--max-running", args->max_running,
                  "with --model: sequences decoded together in one step")
      ->capture_default_str();
  sub->add_option("--max-queued", args->max_queued,
                  "with --model: sequences that may wait beyond --max-running (past it: 429)")
      ->capture_default_str();
  sub->add_option("--max-prefill-tokens", args->max_prefill_tokens,
                  "with --model: prompt tokens prefilled in one step")
      ->capture_default_str();
  sub->add_option("--threads", args->threads,
                  "with --model: LibTorch intra-op threads, which the LoRA kernels share (0: "
                  "LibTorch's default)")
      ->capture_default_str();
  AddTrainServeOptions(sub, &args->train);
  sub->callback([inv, args, max_body] {
    args->train.body_limit_given = max_body->count() > 0;
    inv->run = [inv, args] { return RunServe(inv->global, *args); };
  });
}

LORADB_REGISTER_COMMAND("serve",
                        "run the HTTP endpoint (admin; --model: completions; --train: Tinker)",
                        SetupServe);

}  // namespace
}  // namespace loradb::cli
#endif  // LORADB_HTTP_AVAILABLE
