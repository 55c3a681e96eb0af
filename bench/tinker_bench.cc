// `loradb-bench tinker`: the overhead of the Tinker-compatible service. One training step
// (forward_backward with cross_entropy on a batch of B sequences, then an Adam step) driven by the
// real `tinker` SDK over loopback HTTP (a python3 child against the routes served by this
// process), against the same step submitted to the training service in-process. Both arms run
// on one base in this process, on the same data, with the same rank; their median step times
// are compared (goal: SDK <= 1.2x in-process).
#if defined(LORADB_COMPUTE_AVAILABLE) && defined(LORADB_TINKER_AVAILABLE)
#include <stdlib.h>
#include <sys/wait.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "api/http/server.h"
#include "api/tinker/tinker_routes.h"
#include "bench/bench_util.h"
#include "compute/model/model_tools.h"
#include "compute/training/training_service.h"
#include "storage/store/store.h"
#include "storage/util/status_macros.h"

namespace loradb::bench {
namespace {

namespace fs = std::filesystem;

struct Flags {
  std::string config = "bench-60m";  // compute/configs/NAME.json
  int64_t batch = 32;
  int64_t length = 64;  // tokens per sequence
  int64_t rank = 8;
  int64_t warmup = 2;
  int64_t steps = 5;
  int64_t threads = 0;
};

absl::StatusOr<Flags> ParseTinkerFlags(const std::vector<std::string>& args) {
  Flags f;
  CLI::App app("tinker: a training step through the Tinker SDK vs in-process", "tinker");
  app.add_option("--config", f.config, "model config: compute/configs/NAME.json");
  app.add_option("--batch", f.batch, "sequences per step")->check(CLI::PositiveNumber);
  app.add_option("--length", f.length, "tokens per sequence")->check(CLI::PositiveNumber);
  app.add_option("--rank", f.rank, "LoRA rank")->check(CLI::PositiveNumber);
  app.add_option("--warmup", f.warmup, "untimed steps first")->check(CLI::NonNegativeNumber);
  app.add_option("--steps", f.steps, "timed steps")->check(CLI::PositiveNumber);
  app.add_option("--threads", f.threads, "LibTorch threads (0: its default)")
      ->check(CLI::NonNegativeNumber);
  LORADB_RETURN_IF_ERROR(ParseFlags(&app, args));
  return f;
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

// The in-process arm: the same steps through the service's own calls.
absl::StatusOr<std::vector<double>> InProcessSteps(training::TrainingService* service,
                                                   const Flags& f, int64_t vocab) {
  LORADB_ASSIGN_OR_RETURN(std::string session, service->CreateSession({}, {}));
  training::CreateRunRequest create;
  create.session_id = session;
  create.base_model = service->base_model();
  create.lora.rank = f.rank;
  create.lora.seed = 0;
  LORADB_ASSIGN_OR_RETURN(training::Submitted run, service->CreateRun(create));
  auto wait = [&](const std::string& id) -> absl::Status {
    while (true) {
      LORADB_ASSIGN_OR_RETURN(training::FutureStatus s, service->Retrieve(id, absl::Seconds(30)));
      if (s.state == training::FutureState::kDone) return absl::OkStatus();
      if (s.state == training::FutureState::kFailed) return s.error;
    }
  };
  LORADB_RETURN_IF_ERROR(wait(run.request_id));
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
  adam.learning_rate = 1e-4;
  std::vector<double> times;
  int64_t seq_id = 1;
  for (int64_t i = 0; i < f.warmup + f.steps; ++i) {
    const double t0 = NowSeconds();
    fb.seq_id = seq_id++;
    LORADB_ASSIGN_OR_RETURN(training::Submitted a, service->ForwardBackward(fb));
    LORADB_ASSIGN_OR_RETURN(training::Submitted b, service->OptimStep(run.run_id, seq_id++, adam));
    LORADB_RETURN_IF_ERROR(wait(a.request_id));
    LORADB_RETURN_IF_ERROR(wait(b.request_id));
    if (i >= f.warmup) times.push_back(NowSeconds() - t0);
  }
  return times;
}

absl::Status RunTinkerBench(const std::vector<std::string>& args) {
  LORADB_ASSIGN_OR_RETURN(Flags f, ParseTinkerFlags(args));
  std::string t = (fs::temp_directory_path() / "loradb-tinker-bench-XXXXXX").string();
  if (::mkdtemp(t.data()) == nullptr) return absl::InternalError("cannot create a scratch dir");
  struct Cleanup {
    std::string dir;
    ~Cleanup() {
      std::error_code ec;
      fs::remove_all(dir, ec);
    }
  } cleanup{t};
  const std::string model_dir = t + "/" + f.config;
  Progress(absl::StrCat("tinker: random ", f.config, " checkpoint"));
  LORADB_RETURN_IF_ERROR(
      model::InitRandomCheckpoint(
          absl::StrCat(LORADB_SOURCE_DIR, "/compute/configs/", f.config, ".json"), model_dir, 1,
          "f32")
          .status());
  LORADB_ASSIGN_OR_RETURN(model::ModelSummary summary, model::DescribeModel(model_dir));
  const int64_t vocab = summary.config.vocab_size;
  StoreOptions so;
  LORADB_ASSIGN_OR_RETURN(std::unique_ptr<Store> opened, Store::Open(t + "/store", so));
  std::shared_ptr<Store> store(std::move(opened));

  // In-process arm.
  training::TrainingServiceOptions to;
  to.model_dir = model_dir;
  to.threads = f.threads;
  std::vector<double> inproc;
  {
    LORADB_ASSIGN_OR_RETURN(std::unique_ptr<training::TrainingService> service,
                            training::TrainingService::Create(store.get(), to));
    Progress(absl::StrCat("tinker: in-process, batch ", f.batch, " x ", f.length, " tokens"));
    LORADB_ASSIGN_OR_RETURN(inproc, InProcessSteps(service.get(), f, vocab));
  }

  // SDK arm: the routes on an ephemeral loopback port, a python3 child driving them.
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
  const std::string driver = absl::StrCat(SourceDir(), "/bench/tinker_driver.py");
  const std::string cmd =
      absl::StrCat("python3 '", driver, "' http://127.0.0.1:", server->port(), " ", f.config, " ",
                   f.rank, " ", f.batch, " ", f.length, " ", f.warmup, " ", f.steps, " ", vocab);
  Progress("tinker: SDK over loopback (python3 child)");
  FILE* pipe = ::popen(cmd.c_str(), "r");
  std::string out;
  if (pipe != nullptr) {
    char buf[4096];
    size_t n;
    while ((n = std::fread(buf, 1, sizeof(buf), pipe)) > 0) out.append(buf, n);
  }
  const int rc = pipe == nullptr ? -1 : ::pclose(pipe);
  server->Shutdown();
  serving.join();
  if (rc != -1 && WIFEXITED(rc) && WEXITSTATUS(rc) == 77) {
    Progress("tinker: skipped, the tinker SDK is not installed (tools/dev setup installs it)");
    return absl::OkStatus();
  }
  if (rc != 0) return absl::InternalError(absl::StrCat(cmd, " failed (status ", rc, ")"));
  std::vector<double> sdk;
  std::istringstream lines(out);
  std::string line;
  while (std::getline(lines, line)) {
    nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
    if (!j.is_discarded() && j.contains("step_s")) sdk = j["step_s"].get<std::vector<double>>();
  }
  if (sdk.empty()) return absl::InternalError(cmd + " printed no measurement");

  const double in_s = Median(inproc), sdk_s = Median(sdk);
  nlohmann::json common = {{"bench", "tinker"}, {"config", f.config},
                           {"batch", f.batch},  {"tokens_per_sequence", f.length},
                           {"rank", f.rank},    {"steps", f.steps}};
  nlohmann::json a = common, b = common;
  a["case"] = "step_in_process";
  a["median_step_s"] = in_s;
  b["case"] = "step_sdk_loopback";
  b["median_step_s"] = sdk_s;
  Emit(a);
  Emit(b);
  const double ratio = in_s > 0 ? sdk_s / in_s : 0;
  EmitGoal("tinker", "sdk_step_overhead", ratio, "<= 1.2", ratio > 0 && ratio <= 1.2);
  return absl::OkStatus();
}

LORADB_REGISTER_SCENARIO({"tinker",
                          "Tinker service: SDK-driven forward_backward+optim_step over loopback vs "
                          "in-process [--config NAME] [--batch N] [--length N] [--rank N] "
                          "[--warmup N] [--steps N] [--threads N]",
                          RunTinkerBench,
                          {"--batch", "32", "--length", "32", "--warmup", "1", "--steps", "3"}});

}  // namespace
}  // namespace loradb::bench
#endif
