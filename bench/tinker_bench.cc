// `loradb-bench tinker [overhead|peer|concurrent|all]`: the Tinker-compatible service measured
// side by side with what it replaces. A step is forward_backward with cross_entropy on a batch of
// B sequences, then an Adam step, on one random base (`--config`), rank `--rank`.
//   overhead    the step driven by the real `tinker` SDK over loopback HTTP (a python3 child,
//               bench/tinker_driver.py, against the routes served by this process) vs the same
//               step submitted to the training service in-process. Goal: SDK <= 1.2x.
//   peer        the in-process step vs transformers + peft + torch AdamW training the same LoRA
//               (rank, alpha 32, q/k/v/o/gate/up/down) on the same base and batch with the same
//               thread count (bench/peft_peer_driver.py). Their first-step losses must agree (the
//               two do the same work) or the case fails. Goal: loradb <= 0.5x the peer's time.
//   concurrent  K = 3 SDK client processes, each training its own run (policy), against one
//               `loradb serve --model --train` process: the timed loops all at once vs the same
//               three one after another, each arm against a fresh server process (and store).
//               The arms alternate `--repeats` times; medians are compared. Goals: wall-time
//               ratio >= 1.5, the server's peak RSS (VmHWM) within 10%.
#if defined(LORADB_COMPUTE_AVAILABLE) && defined(LORADB_TINKER_AVAILABLE)
#include <ATen/Parallel.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "api/http/server.h"
#include "api/tinker/tinker_routes.h"
#include "bench/bench_util.h"
#include "bench/dist_bench.h"
#include "compute/model/cpu_block_cache.h"
#include "compute/model/model_tools.h"
#include "compute/training/training_service.h"
#include "storage/store/store.h"
#include "storage/util/status_macros.h"

extern char** environ;

namespace loradb::bench {
namespace {

namespace fs = std::filesystem;

constexpr int kConcurrentClients = 3;
// The Adam parameters of every arm (the SDK's defaults besides the learning rate).
constexpr double kLearningRate = 1e-4, kBeta1 = 0.9, kBeta2 = 0.95, kEps = 1e-12;
// LoRA alpha of the peer: the training service's default (TrainingServiceOptions::lora_alpha).
constexpr double kLoraAlpha = 32;

struct Flags {
  std::string which = "all";
  std::string config = "bench-60m";  // compute/configs/NAME.json
  int64_t batch = 32;
  int64_t length = 64;  // tokens per sequence
  int64_t rank = 8;
  int64_t warmup = 2;
  int64_t steps = 5;
  int64_t threads = 0;
  int64_t repeats = 1;           // concurrent: (sequential, parallel) pairs
  std::string loradb;            // concurrent: the `loradb` command (default: beside this build)
  double loss_tolerance = 1e-4;  // peer: relative first-step loss difference allowed
};

absl::StatusOr<Flags> ParseTinkerFlags(const std::vector<std::string>& args) {
  Flags f;
  CLI::App app("tinker: the Tinker service vs in-process, a transformers+peft peer, and K clients",
               "tinker");
  app.add_option("case", f.which, "overhead, peer, concurrent or all")
      ->check(CLI::IsMember({"overhead", "peer", "concurrent", "all"}));
  app.add_option("--config", f.config, "model config: compute/configs/NAME.json");
  app.add_option("--batch", f.batch, "sequences per step")->check(CLI::PositiveNumber);
  app.add_option("--length", f.length, "tokens per sequence")->check(CLI::PositiveNumber);
  app.add_option("--rank", f.rank, "LoRA rank")->check(CLI::PositiveNumber);
  app.add_option("--warmup", f.warmup, "untimed steps first")->check(CLI::NonNegativeNumber);
  app.add_option("--steps", f.steps, "timed steps")->check(CLI::PositiveNumber);
  app.add_option("--threads", f.threads, "LibTorch threads (0: its default)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--repeats", f.repeats, "concurrent: (sequential, parallel) pairs")
      ->check(CLI::PositiveNumber);
  app.add_option("--loradb", f.loradb, "concurrent: the loradb command (default: this build's)");
  app.add_option("--loss-tolerance", f.loss_tolerance,
                 "peer: relative first-step loss difference allowed")
      ->check(CLI::PositiveNumber);
  LORADB_RETURN_IF_ERROR(ParseFlags(&app, args));
  return f;
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

// Runs `cmd` (a shell command line) and returns the last JSON object line of its stdout that has
// `key`; nullopt when the command exits 77 (a Python package it needs is missing).
absl::StatusOr<std::optional<nlohmann::json>> RunJsonChild(const std::string& cmd,
                                                           const std::string& key) {
  LORADB_ASSIGN_OR_RETURN(JsonCommandResult r, RunJsonCommand(cmd, key));
  if (r.exit_status == 77) return std::optional<nlohmann::json>();
  if (r.exit_status != 0) {
    return absl::InternalError(absl::StrCat(cmd, " failed (exit status ", r.exit_status, ")"));
  }
  if (r.last_object.is_null()) {
    return absl::InternalError(absl::StrCat(cmd, " printed no '", key, "' line"));
  }
  return std::optional<nlohmann::json>(std::move(r.last_object));
}

// What the in-process arm measured.
struct InProcess {
  std::vector<double> step_s;
  double first_loss = 0;  // loss:sum of the first forward_backward (before any update)
};

// The in-process arm: the same steps through the service's own calls.
absl::StatusOr<InProcess> InProcessSteps(training::TrainingService* service, const Flags& f,
                                         int64_t vocab) {
  LORADB_ASSIGN_OR_RETURN(std::string session, service->CreateSession({}, {}));
  training::CreateRunRequest create;
  create.session_id = session;
  create.base_model = service->base_model();
  create.lora.rank = f.rank;
  create.lora.seed = 0;
  LORADB_ASSIGN_OR_RETURN(training::Submitted run, service->CreateRun(create));
  auto wait = [&](const std::string& id) -> absl::StatusOr<training::FutureStatus> {
    while (true) {
      LORADB_ASSIGN_OR_RETURN(training::FutureStatus s, service->Retrieve(id, absl::Seconds(30)));
      if (s.state == training::FutureState::kDone) return s;
      if (s.state == training::FutureState::kFailed) return s.error;
    }
  };
  LORADB_RETURN_IF_ERROR(wait(run.request_id).status());
  training::ForwardBackwardRequest fb;
  fb.run_id = run.run_id;
  fb.loss_fn = "cross_entropy";
  for (int64_t i = 0; i < f.batch; ++i) {
    std::vector<int64_t> seq;
    for (int64_t k = 0; k <= f.length; ++k) seq.push_back((7 * i + 3 * k) % (vocab - 1) + 1);
    training::DatumInput d;
    d.model_input.assign(seq.begin(), seq.end() - 1);
    training::TensorInput targets;
    targets.dtype = training::TensorInput::DType::kInt64;
    targets.ints.assign(seq.begin() + 1, seq.end());
    training::TensorInput weights;
    weights.floats.assign(static_cast<size_t>(f.length), 1.0f);
    d.loss_fn_inputs["target_tokens"] = targets;
    d.loss_fn_inputs["weights"] = weights;
    fb.data.push_back(std::move(d));
  }
  training::AdamParams adam;
  adam.learning_rate = kLearningRate;
  adam.beta1 = kBeta1;
  adam.beta2 = kBeta2;
  adam.eps = kEps;
  InProcess out;
  int64_t seq_id = 1;
  for (int64_t i = 0; i < f.warmup + f.steps; ++i) {
    const double t0 = NowSeconds();
    fb.seq_id = seq_id++;
    LORADB_ASSIGN_OR_RETURN(training::Submitted a, service->ForwardBackward(fb));
    LORADB_ASSIGN_OR_RETURN(training::Submitted b, service->OptimStep(run.run_id, seq_id++, adam));
    LORADB_ASSIGN_OR_RETURN(training::FutureStatus fa, wait(a.request_id));
    LORADB_RETURN_IF_ERROR(wait(b.request_id).status());
    if (i >= f.warmup) out.step_s.push_back(NowSeconds() - t0);
    if (i == 0) {
      const auto* r = std::get_if<training::ForwardBackwardResult>(&*fa.value);
      if (r == nullptr || !r->metrics.count("loss:sum")) {
        return absl::InternalError("forward_backward returned no loss:sum");
      }
      out.first_loss = r->metrics.at("loss:sum");
    }
  }
  return out;
}

nlohmann::json Common(const Flags& f) {
  return {{"bench", "tinker"}, {"config", f.config},
          {"batch", f.batch},  {"tokens_per_sequence", f.length},
          {"rank", f.rank},    {"steps", f.steps}};
}

// The SDK arm of `overhead`: the routes on an ephemeral loopback port of this process, a python3
// child driving them. nullopt when the SDK is not installed.
absl::StatusOr<std::optional<std::vector<double>>> SdkSteps(std::shared_ptr<Store> store,
                                                            const Flags& f,
                                                            const std::string& model_dir,
                                                            int64_t vocab) {
  http::ServerOptions ho;
  ho.port = 0;
  ho.max_body_bytes = size_t{64} << 20;
  LORADB_ASSIGN_OR_RETURN(std::unique_ptr<http::Server> server, http::Server::Create(ho));
  tinker::TinkerRoutesOptions ro;
  ro.model_dir = model_dir;
  ro.threads = f.threads;
  LORADB_RETURN_IF_ERROR(tinker::AddTinkerRoutes(store, ro, server.get()));
  LORADB_RETURN_IF_ERROR(server->Bind());
  std::thread serving([&] { (void)server->Serve(); });
  const std::string cmd =
      absl::StrCat("python3 '", SourceDir(),
                   "/bench/tinker_driver.py' overhead http://127.0.0.1:", server->port(),
                   " --base ", f.config, " --rank ", f.rank, " --batch ", f.batch, " --length ",
                   f.length, " --warmup ", f.warmup, " --steps ", f.steps, " --vocab ", vocab);
  Progress("tinker: SDK over loopback (python3 child)");
  absl::StatusOr<std::optional<nlohmann::json>> out = RunJsonChild(cmd, "step_s");
  server->Shutdown();
  serving.join();
  LORADB_RETURN_IF_ERROR(out.status());
  if (!out->has_value()) return std::optional<std::vector<double>>();
  return std::optional<std::vector<double>>((**out)["step_s"].get<std::vector<double>>());
}

// `peer`: transformers + peft on the same base and batch, beside the in-process arm.
absl::Status RunPeer(const Flags& f, const std::string& model_dir, int64_t vocab,
                     const InProcess& loradb) {
  // The thread count LibTorch runs the in-process arm with.
  const int64_t threads = f.threads > 0 ? f.threads : at::get_num_threads();
  const std::string cmd = absl::StrCat(
      "python3 '", SourceDir(), "/bench/peft_peer_driver.py' '", model_dir, "' --rank ", f.rank,
      " --alpha ", kLoraAlpha, " --batch ", f.batch, " --length ", f.length, " --vocab ", vocab,
      " --warmup ", f.warmup, " --steps ", f.steps, " --threads ", threads, " --lr ", kLearningRate,
      " --beta1 ", kBeta1, " --beta2 ", kBeta2, " --eps ", kEps);
  Progress(
      absl::StrCat("tinker: transformers + peft peer, ", threads, " thread(s) (python3 child)"));
  LORADB_ASSIGN_OR_RETURN(std::optional<nlohmann::json> out, RunJsonChild(cmd, "step_s"));
  if (!out) {
    Progress("tinker: peer skipped, torch/transformers/peft are not installed (tools/dev setup)");
    return absl::OkStatus();
  }
  const double peer_loss = (*out)["first_loss"].get<double>();
  const double diff = std::abs(peer_loss - loradb.first_loss);
  if (!(diff <= f.loss_tolerance * std::abs(loradb.first_loss))) {
    return absl::InternalError(absl::StrCat(
        "peer: first-step loss of transformers+peft (", peer_loss, ") differs from loradb's (",
        loradb.first_loss, ") by more than ", f.loss_tolerance,
        " relative: the two arms do not train the same model on the same batch"));
  }
  const double peer_s = Median((*out)["step_s"].get<std::vector<double>>());
  const double ours_s = Median(loradb.step_s);
  nlohmann::json line = Common(f);
  line["case"] = "peer_transformers_peft";
  line["threads"] = threads;
  line["median_step_s"] = peer_s;
  line["loradb_median_step_s"] = ours_s;
  line["first_loss"] = peer_loss;
  line["loradb_first_loss"] = loradb.first_loss;
  Emit(line);
  const double ratio = peer_s > 0 ? ours_s / peer_s : 0;
  EmitGoal("tinker", "peer_step_ratio", ratio, "<= 0.5", ratio > 0 && ratio <= 0.5);
  return absl::OkStatus();
}

// A `loradb serve --model --train` child process on an ephemeral loopback port.
class ServeProcess {
 public:
  ~ServeProcess() { (void)Stop(); }

  absl::Status Start(const std::vector<std::string>& argv) {
    int fds[2];
    if (::pipe2(fds, O_CLOEXEC) != 0) return absl::InternalError("pipe failed");
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_adddup2(&actions, fds[1], STDOUT_FILENO);
    std::vector<char*> args;
    for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    const int rc = ::posix_spawn(&pid_, args[0], &actions, nullptr, args.data(), environ);
    posix_spawn_file_actions_destroy(&actions);
    ::close(fds[1]);
    out_fd_ = fds[0];
    if (rc != 0) {
      pid_ = -1;
      return absl::InternalError(absl::StrCat("cannot start ", argv[0], ": ", strerror(rc)));
    }
    // `loradb serve` prints "listening on http://HOST:PORT" once it accepts connections.
    std::string text;
    const double deadline = NowSeconds() + 300;
    while (NowSeconds() < deadline) {
      const size_t at = text.find("listening on http://");
      const size_t nl = at == std::string::npos ? at : text.find('\n', at);
      if (nl != std::string::npos) {
        const std::string line = text.substr(at, nl - at);
        int port = 0;
        if (!absl::SimpleAtoi(line.substr(line.rfind(':') + 1), &port)) {
          return absl::InternalError("cannot read the port from: " + line);
        }
        url_ = absl::StrCat("http://127.0.0.1:", port);
        return absl::OkStatus();
      }
      struct pollfd p = {out_fd_, POLLIN, 0};
      if (::poll(&p, 1, 1000) <= 0) continue;
      char buf[1024];
      const ssize_t n = ::read(out_fd_, buf, sizeof(buf));
      if (n <= 0) break;
      text.append(buf, static_cast<size_t>(n));
    }
    return absl::InternalError("loradb serve did not start listening: " + text);
  }

  const std::string& url() const { return url_; }

  // The server's peak resident set (VmHWM), in bytes; 0 when unreadable.
  int64_t PeakRssBytes() const {
    std::ifstream in(absl::StrCat("/proc/", pid_, "/status"));
    std::string line;
    while (std::getline(in, line)) {
      if (line.rfind("VmHWM:", 0) == 0) return std::stoll(line.substr(6)) * 1024;
    }
    return 0;
  }

  // SIGTERM (a graceful shutdown), SIGKILL after 60 s.
  absl::Status Stop() {
    if (pid_ <= 0) return absl::OkStatus();
    ::kill(pid_, SIGTERM);
    int status = 0;
    for (int i = 0; i < 600; ++i) {
      if (::waitpid(pid_, &status, WNOHANG) == pid_) break;
      if (i == 599) {
        ::kill(pid_, SIGKILL);
        ::waitpid(pid_, &status, 0);
      }
      ::usleep(100000);
    }
    pid_ = -1;
    if (out_fd_ >= 0) ::close(out_fd_);
    out_fd_ = -1;
    return absl::OkStatus();
  }

 private:
  pid_t pid_ = -1;
  int out_fd_ = -1;
  std::string url_;
};

// One arm of `concurrent`: a fresh store and server, K client processes; returns the driver's
// measurement with the server's peak RSS added, or nullopt when the SDK is not installed.
absl::StatusOr<std::optional<nlohmann::json>> ConcurrentArm(const Flags& f,
                                                            const std::string& scratch,
                                                            const std::string& model_dir,
                                                            int64_t vocab,
                                                            const std::string& schedule, int arm) {
  const std::string store_dir = absl::StrCat(scratch, "/serve-store-", arm);
  { LORADB_RETURN_IF_ERROR(Store::Open(store_dir).status()); }
  std::vector<std::string> argv = {f.loradb,
                                   "--store",
                                   store_dir,
                                   "serve",
                                   "--listen",
                                   "127.0.0.1:0",
                                   "--model",
                                   model_dir,
                                   "--train",
                                   "--max-body-bytes",
                                   std::to_string(64 << 20)};
  if (f.threads > 0) {
    argv.push_back("--threads");
    argv.push_back(std::to_string(f.threads));
  }
  ServeProcess server;
  LORADB_RETURN_IF_ERROR(server.Start(argv));
  Progress(absl::StrCat("tinker: concurrent, ", kConcurrentClients, " SDK clients, ", schedule,
                        " (fresh server at ", server.url(), ")"));
  const std::string cmd =
      absl::StrCat("python3 '", SourceDir(), "/bench/tinker_driver.py' clients ", server.url(),
                   " --base ", f.config, " --rank ", f.rank, " --batch ", f.batch, " --length ",
                   f.length, " --warmup ", f.warmup, " --steps ", f.steps, " --vocab ", vocab,
                   " --clients ", kConcurrentClients, " --schedule ", schedule);
  absl::StatusOr<std::optional<nlohmann::json>> out = RunJsonChild(cmd, "wall_s");
  const int64_t rss = server.PeakRssBytes();
  LORADB_RETURN_IF_ERROR(server.Stop());
  std::error_code ec;
  fs::remove_all(store_dir, ec);
  LORADB_RETURN_IF_ERROR(out.status());
  if (!out->has_value()) return out;
  (**out)["server_peak_rss_bytes"] = rss;
  return out;
}

absl::Status RunConcurrent(const Flags& f, const std::string& scratch, const std::string& model_dir,
                           int64_t vocab) {
  if (!fs::exists(f.loradb)) {
    return absl::NotFoundError(absl::StrCat("concurrent: no loradb command at '", f.loradb,
                                            "' (build loradb_cli, or pass --loradb PATH)"));
  }
  const double load0 = LoadAverage1m();
  std::vector<double> seq_s, par_s;
  std::vector<double> seq_rss, par_rss;
  int arm = 0;
  for (int64_t r = 0; r < f.repeats; ++r) {
    for (const std::string schedule : {"sequential", "parallel"}) {
      LORADB_ASSIGN_OR_RETURN(std::optional<nlohmann::json> j,
                              ConcurrentArm(f, scratch, model_dir, vocab, schedule, arm++));
      if (!j) {
        Progress("tinker: concurrent skipped, the tinker SDK is not installed");
        return absl::OkStatus();
      }
      nlohmann::json line = Common(f);
      line["case"] = "concurrent";
      line["schedule"] = schedule;
      line["clients"] = kConcurrentClients;
      line["threads"] = f.threads;
      for (const char* k :
           {"wall_s", "client_s", "first_loss", "last_loss", "server_peak_rss_bytes"}) {
        line[k] = (*j)[k];
      }
      Emit(line);
      const double wall = (*j)["wall_s"].get<double>();
      const double rss = (*j)["server_peak_rss_bytes"].get<double>();
      (schedule == std::string("sequential") ? seq_s : par_s).push_back(wall);
      (schedule == std::string("sequential") ? seq_rss : par_rss).push_back(rss);
    }
  }
  const double ratio = Median(seq_s) / Median(par_s);
  const double rss_ratio = Median(par_rss) / Median(seq_rss);
  nlohmann::json summary = Common(f);
  summary["case"] = "concurrent_summary";
  summary["clients"] = kConcurrentClients;
  summary["repeats"] = f.repeats;
  summary["sequential_median_s"] = Median(seq_s);
  summary["parallel_median_s"] = Median(par_s);
  summary["speedup"] = ratio;
  summary["peak_rss_ratio"] = rss_ratio;
  summary["loadavg_1m_start"] = load0;
  summary["loadavg_1m_end"] = LoadAverage1m();
  Emit(summary);
  EmitGoal("tinker", "concurrent_speedup", ratio, ">= 1.5", ratio >= 1.5);
  EmitGoal("tinker", "concurrent_peak_rss_ratio", rss_ratio, "within 10% (0.9..1.1)",
           std::abs(rss_ratio - 1.0) <= 0.1);
  return absl::OkStatus();
}

absl::Status RunTinkerBench(const std::vector<std::string>& args) {
  LORADB_ASSIGN_OR_RETURN(Flags f, ParseTinkerFlags(args));
  if (f.loradb.empty()) {
    std::error_code ec;
    const fs::path self = fs::read_symlink("/proc/self/exe", ec);
    if (!ec) f.loradb = (self.parent_path().parent_path() / "tools" / "loradb").string();
  }
  std::string t = (fs::temp_directory_path() / "loradb-tinker-bench-XXXXXX").string();
  if (::mkdtemp(t.data()) == nullptr) return absl::InternalError("cannot create a scratch dir");
  struct Cleanup {
    std::string dir;
    ~Cleanup() {
      std::error_code ec;
      fs::remove_all(dir, ec);
    }
  } cleanup{t};
  // The base's directory name is the base_model clients pass.
  const std::string model_dir = t + "/" + f.config;
  Progress(absl::StrCat("tinker: random ", f.config, " checkpoint"));
  LORADB_RETURN_IF_ERROR(
      model::InitRandomCheckpoint(
          absl::StrCat(LORADB_SOURCE_DIR, "/compute/configs/", f.config, ".json"), model_dir, 1,
          "f32")
          .status());
  LORADB_ASSIGN_OR_RETURN(model::ModelSummary summary, model::DescribeModel(model_dir));
  const int64_t vocab = summary.config.vocab_size;
  const bool all = f.which == "all";

  if (all || f.which == "overhead" || f.which == "peer") {
    LORADB_ASSIGN_OR_RETURN(std::unique_ptr<Store> opened, Store::Open(t + "/store"));
    std::shared_ptr<Store> store(std::move(opened));
    training::TrainingServiceOptions to;
    to.model_dir = model_dir;
    to.threads = f.threads;
    InProcess inproc;
    {
      LORADB_ASSIGN_OR_RETURN(std::unique_ptr<training::TrainingService> service,
                              training::TrainingService::Create(store.get(), to));
      Progress(absl::StrCat("tinker: in-process, batch ", f.batch, " x ", f.length, " tokens"));
      LORADB_ASSIGN_OR_RETURN(inproc, InProcessSteps(service.get(), f, vocab));
    }
    nlohmann::json a = Common(f);
    a["case"] = "step_in_process";
    a["median_step_s"] = Median(inproc.step_s);
    a["first_loss"] = inproc.first_loss;
    const model::CpuBlockCacheStats cache = model::GetCpuBlockCacheStats();
    a["cpu_block_cache"] = {{"installed", cache.installed},
                            {"hits", cache.hits},
                            {"misses", cache.misses},
                            {"cached_bytes", cache.cached_bytes}};
    Emit(a);
    if (all || f.which == "overhead") {
      LORADB_ASSIGN_OR_RETURN(std::optional<std::vector<double>> sdk,
                              SdkSteps(store, f, model_dir, vocab));
      if (!sdk) {
        Progress("tinker: SDK arm skipped, the tinker SDK is not installed (tools/dev setup)");
      } else {
        nlohmann::json b = Common(f);
        b["case"] = "step_sdk_loopback";
        b["median_step_s"] = Median(*sdk);
        Emit(b);
        const double in_s = Median(inproc.step_s), sdk_s = Median(*sdk);
        const double ratio = in_s > 0 ? sdk_s / in_s : 0;
        EmitGoal("tinker", "sdk_step_overhead", ratio, "<= 1.2", ratio > 0 && ratio <= 1.2);
      }
    }
    if (all || f.which == "peer") LORADB_RETURN_IF_ERROR(RunPeer(f, model_dir, vocab, inproc));
  }
  if (all || f.which == "concurrent") LORADB_RETURN_IF_ERROR(RunConcurrent(f, t, model_dir, vocab));
  return absl::OkStatus();
}

LORADB_REGISTER_SCENARIO({"tinker",
                          "Tinker service: SDK step over loopback vs in-process (overhead), vs "
                          "transformers+peft (peer), K=3 SDK clients at once vs one after another "
                          "(concurrent) [overhead|peer|concurrent|all] [--config NAME] [--batch N] "
                          "[--length N] [--rank N] [--warmup N] [--steps N] [--threads N] "
                          "[--repeats N] [--loradb PATH]",
                          RunTinkerBench,
                          {"--batch", "32", "--length", "32", "--warmup", "1", "--steps", "3"}});

}  // namespace
}  // namespace loradb::bench
#endif
