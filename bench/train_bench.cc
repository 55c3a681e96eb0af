// loradb-bench train: the trainer's two published comparisons.
//   handoff     hand a rank-32 policy trained on a Qwen3-0.6B-shaped random base (bf16, CPU) to
//               a decoder (a) as an adapter revision: publish (bf16, source = checkpoint, alias
//               moved) + acquire (resolve the alias, read the blob, build the model's adapter),
//               vs (b) merging it into the base, writing the full safetensors checkpoint and
//               loading that into a fresh model. Goal: (a) >= 18.3x faster than (b).
//   concurrent  K = 3 GRPO policies (tiny dense base, fp32) for the same number of steps each,
//               one after another vs time-sliced (TrainTimeSliced: `--workers` threads step
//               cohorts of `--cohort` policies, whose rollouts share decode batches and whose
//               rows share forward/backward, in `--sliced-micro-batches` micro-batches). Each
//               arm runs in its own child process; the time-sliced one runs `--workers` workers of
//               `--threads` LibTorch intra-op threads, the sequential one gets the same cores as
//               `--threads` x `--workers` intra-op threads. The two arms alternate `--repeats`
//               times (3) and the goal compares their medians.
//               Goals: wall-time ratio >= 1.5 and peak RSS within 10%.
// Flags: --layers N (handoff base depth, default 28 = Qwen3-0.6B); concurrent: --steps N (20),
// --threads N (1), --workers N (2), --cohort N (1), --sliced-micro-batches N (1), --prompts N
// and --group N (GRPO prompts x samples per policy-step, 8 x 8), --reference-threads N (also
// run the sequential arm with N intra-op threads; off by default), --repeats N (3).
#ifdef LORADB_COMPUTE_AVAILABLE

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <ATen/core/grad_mode.h>
#include <sys/resource.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "bench/bench_util.h"
#include "bench/dist_bench.h"
#include "compute/model/checkpoint.h"
#include "compute/model/cpu_block_cache.h"
#include "compute/model/qwen3_model.h"
#include "compute/trainer/checkpoint.h"
#include "compute/trainer/tasks.h"
#include "compute/trainer/tensor_io.h"
#include "compute/trainer/time_slicer.h"
#include "storage/formats/safetensors.h"
#include "storage/store/store.h"
#include "storage/util/status_macros.h"

namespace loradb::bench {
namespace {

namespace fs = std::filesystem;
using trainer::Trainer;

struct Flags {
  std::string which = "all";
  int64_t layers = 28;
  int64_t steps = 20;  // ~1 s per arm on two cores: long enough to average scheduling noise
  // concurrent: LibTorch intra-op threads of both arms, GRPO prompts x group per policy-step,
  // and the time-sliced arm's micro-batches per shared step.
  int64_t threads = 1;
  int64_t prompts = 8;
  int64_t group = 8;
  int64_t sliced_micro_batches = 1;
  int64_t workers = 2;  // time-sliced: scheduler threads
  int64_t cohort = 1;   // time-sliced: policies per shared step
  // > 0: also run the sequential arm with this many intra-op threads (a reference line).
  int64_t reference_threads = 0;
  // concurrent: (sequential, time-sliced) pairs run one after another; medians are compared.
  int64_t repeats = 3;
  // Internal: `concurrent` runs each mode in a child process of this binary with these set.
  std::string child_mode;  // sequential | time_sliced
  std::string child_base;  // the base checkpoint the parent wrote
};

absl::StatusOr<Flags> ParseTrainFlags(const std::vector<std::string>& args) {
  Flags f;
  CLI::App app("train: trainer hand-off and time-sliced concurrent training", "train");
  app.add_option("case", f.which, "handoff, concurrent or all")
      ->check(CLI::IsMember({"handoff", "concurrent", "all"}));
  const auto positive = CLI::PositiveNumber;
  app.add_option("--layers", f.layers, "decoder layers")->check(positive);
  app.add_option("--steps", f.steps, "training steps per arm")->check(positive);
  app.add_option("--threads", f.threads, "LibTorch intra-op threads")->check(positive);
  app.add_option("--prompts", f.prompts, "GRPO prompts per policy-step")->check(positive);
  app.add_option("--group", f.group, "GRPO group size")->check(positive);
  app.add_option("--workers", f.workers, "time-sliced: scheduler threads")->check(positive);
  app.add_option("--cohort", f.cohort, "time-sliced: policies per shared step")->check(positive);
  app.add_option("--repeats", f.repeats, "(sequential, time-sliced) pairs")->check(positive);
  app.add_option("--reference-threads", f.reference_threads,
                 "also run the sequential arm with this many threads")
      ->check(positive);
  app.add_option("--sliced-micro-batches", f.sliced_micro_batches,
                 "time-sliced: micro-batches per shared step")
      ->check(positive);
  // Internal: how `concurrent` runs each arm in a child process of this binary.
  app.add_option("--child-mode", f.child_mode)->group("");
  app.add_option("--child-base", f.child_base)->group("");
  LORADB_RETURN_IF_ERROR(ParseFlags(&app, args));
  return f;
}

// This process's peak RSS (VmHWM), in bytes.
int64_t PeakRssBytes() {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("VmHWM:", 0) == 0) return std::stoll(line.substr(6)) * 1024;
  }
  return 0;
}

class ScratchDir {
 public:
  ScratchDir() {
    std::string t = (fs::temp_directory_path() / "loradb-train-bench-XXXXXX").string();
    path_ = ::mkdtemp(t.data()) ? t : "";
  }
  ~ScratchDir() {
    std::error_code ec;
    if (!path_.empty()) fs::remove_all(path_, ec);
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

ModelConfig Qwen3_0_6B(int64_t layers) {
  ModelConfig c;
  c.model_type = "qwen3";
  c.vocab_size = 151936;
  c.hidden_size = 1024;
  c.intermediate_size = 3072;
  c.num_hidden_layers = layers;
  c.num_attention_heads = 16;
  c.num_key_value_heads = 8;
  c.head_dim = 128;
  c.max_position_embeddings = 40960;
  c.rope_theta = 1e6;
  c.tie_word_embeddings = true;
  c.torch_dtype = "bfloat16";
  return c;
}

absl::Status RunHandoff(const Flags& f) {
  ScratchDir scratch;
  if (scratch.path().empty()) return absl::InternalError("cannot create a scratch directory");
  const std::string base_dir = scratch.path() + "/base", merged_dir = scratch.path() + "/merged";
  const ModelConfig config = Qwen3_0_6B(f.layers);
  Progress(absl::StrCat("handoff: writing a random Qwen3-0.6B-shaped base (", f.layers,
                        " layers, bf16)"));
  LORADB_RETURN_IF_ERROR(model::WriteRandomCheckpoint(config, base_dir, 1, at::kBFloat16));
  LORADB_ASSIGN_OR_RETURN(auto base, model::Qwen3Model::Load(base_dir));
  Trainer t(base.get());
  trainer::PolicyOptions po;
  po.name = "bench/handoff";
  po.lora.rank = 32;
  po.lora.alpha = 64;
  po.schedule.lr = 1e-3;
  LORADB_ASSIGN_OR_RETURN(int p, t.AddPolicy(po));
  // One real training step so B is non-zero.
  trainer::Datum d;
  d.tokens = {1, 2, 3, 4, 5};
  d.weights = {1, 1, 1, 1};
  LORADB_RETURN_IF_ERROR(t.ForwardBackward({{p, trainer::LossKind::kCrossEntropy, {d}}}).status());
  LORADB_RETURN_IF_ERROR(t.OptimStep(p).status());
  LORADB_ASSIGN_OR_RETURN(auto store, Store::Open(scratch.path() + "/store"));
  LORADB_RETURN_IF_ERROR(trainer::EnsurePolicy(store.get(), "qwen3-0.6b", base_dir, po.name));
  LORADB_ASSIGN_OR_RETURN(CheckpointRecord ck, trainer::SaveCheckpoint(store.get(), t, p, 0));
  const int64_t adapter_params = t.parameters(p).num_parameters();

  // (a) adapter revision: publish + acquire.
  Progress("handoff: (a) publish + acquire");
  const double a0 = NowSeconds();
  LORADB_ASSIGN_OR_RETURN(RevisionRecord rev,
                          trainer::PublishForSampling(store.get(), t, p, ck.id, "latest"));
  LORADB_ASSIGN_OR_RETURN(RevisionRecord got, store->Resolve(po.name + ":latest"));
  LORADB_ASSIGN_OR_RETURN(TensorSet tensors, store->ReadTensors(got));
  std::vector<model::LoraModuleInput> modules;
  for (const auto& m : t.parameters(p).modules()) {
    const TensorView* a = tensors.Find(trainer::LoraAName(m.name));
    const TensorView* b = tensors.Find(trainer::LoraBName(m.name));
    if (a == nullptr || b == nullptr) return absl::DataLossError("revision lacks " + m.name);
    model::LoraModuleInput in;
    in.module = m.name;
    LORADB_ASSIGN_OR_RETURN(in.a, trainer::FromView(*a, at::kBFloat16));
    LORADB_ASSIGN_OR_RETURN(in.b, trainer::FromView(*b, at::kBFloat16));
    in.scale = po.lora.Scale();
    modules.push_back(std::move(in));
  }
  LORADB_ASSIGN_OR_RETURN(model::LoraAdapter adapter,
                          model::LoraAdapter::Create(config, std::move(modules), at::kBFloat16));
  const double adapter_s = NowSeconds() - a0;
  (void)adapter;

  // (b) merge into the base, write the full checkpoint, load it into a fresh model.
  Progress("handoff: (b) merge + write + load");
  const double b0 = NowSeconds();
  LORADB_ASSIGN_OR_RETURN(TensorSet base_tensors, model::ReadCheckpointTensors(base_dir));
  std::map<std::string, at::Tensor> merged;
  {
    at::NoGradGuard no_grad;
    for (const auto& m : t.parameters(p).modules()) {
      const std::string name = "model." + m.name + ".weight";
      const TensorView* w = base_tensors.Find(name);
      if (w == nullptr) return absl::NotFoundError("base lacks " + name);
      LORADB_ASSIGN_OR_RETURN(at::Tensor wt, trainer::FromView(*w, at::kFloat));
      merged[name] = (wt + at::matmul(m.b.detach(), m.a.detach()) * po.lora.Scale())
                         .to(at::kBFloat16)
                         .contiguous();
    }
  }
  std::vector<TensorView> out;
  for (const TensorView& v : base_tensors.tensors()) {
    auto it = merged.find(v.name);
    if (it == merged.end()) {
      out.push_back(v);
      continue;
    }
    TensorView mv = v;
    mv.data = static_cast<const std::byte*>(it->second.data_ptr());
    out.push_back(mv);
  }
  fs::create_directories(merged_dir);
  LORADB_RETURN_IF_ERROR(safetensors::WriteFile(merged_dir + "/model.safetensors", out, {}));
  fs::copy_file(base_dir + "/config.json", merged_dir + "/config.json");
  LORADB_ASSIGN_OR_RETURN(auto fresh, model::Qwen3Model::Load(merged_dir));
  const double merge_s = NowSeconds() - b0;
  uint64_t base_bytes = 0;
  for (const TensorView& v : out) base_bytes += v.nbytes;

  Emit({{"bench", "train"},
        {"case", "handoff"},
        {"layers", f.layers},
        {"rank", 32},
        {"base_params", fresh->num_parameters()},
        {"adapter_params", adapter_params},
        {"adapter_bytes", rev.blob.bytes},
        {"base_bytes", base_bytes},
        {"adapter_handoff_s", adapter_s},
        {"merge_handoff_s", merge_s},
        {"speedup", merge_s / adapter_s}});
  EmitGoal("train", "handoff_speedup", merge_s / adapter_s, ">= 18.3", merge_s / adapter_s >= 18.3);
  return absl::OkStatus();
}

ModelConfig TinyDense() {
  // compute/configs/tiny-dense.json.
  ModelConfig config;
  config.model_type = "qwen3";
  config.vocab_size = 1024;
  config.hidden_size = 128;
  config.intermediate_size = 256;
  config.num_hidden_layers = 4;
  config.num_attention_heads = 4;
  config.num_key_value_heads = 2;
  config.head_dim = 48;
  config.max_position_embeddings = 512;
  config.rope_theta = 10000.0;
  config.torch_dtype = "float32";
  return config;
}

trainer::StepConfig ConcurrentStepConfig(const Flags& f) {
  trainer::StepConfig sc;
  sc.grpo_prompts = f.prompts;
  sc.grpo_group = f.group;
  return sc;
}

// CPU seconds (user + system) this process has used.
double ProcessCpuSeconds() {
  struct rusage u;
  ::getrusage(RUSAGE_SELF, &u);
  auto sec = [](const struct timeval& t) { return t.tv_sec + t.tv_usec * 1e-6; };
  return sec(u.ru_utime) + sec(u.ru_stime);
}
constexpr int kConcurrentPolicies = 3;

// One mode of `concurrent` in this (child) process: K policies on the base in `f.child_base`,
// `f.steps` optimizer steps each; prints the mode's measurement line with the process's peak RSS.
absl::Status RunConcurrentChild(const Flags& f) {
  const bool sliced = f.child_mode == "time_sliced";
  if (!sliced && f.child_mode != "sequential") {
    return absl::InvalidArgumentError("--child-mode must be sequential or time_sliced");
  }
  LORADB_ASSIGN_OR_RETURN(auto base, model::Qwen3Model::Load(f.child_base));
  LORADB_ASSIGN_OR_RETURN(auto task, trainer::MakeTask("arithmetic", base->config().vocab_size, 1));
  trainer::StepConfig sc = ConcurrentStepConfig(f);
  if (sliced) sc.micro_batches = f.sliced_micro_batches;
  Trainer t(base.get());
  for (int i = 0; i < kConcurrentPolicies; ++i) {
    trainer::PolicyOptions po;
    po.name = absl::StrCat("bench/p", i);
    po.seed = static_cast<uint64_t>(i + 1);
    po.schedule.lr = 1e-3;
    LORADB_RETURN_IF_ERROR(t.AddPolicy(po).status());
  }
  double sample_s = 0, fb_s = 0, optim_s = 0;
  int64_t cohort_steps = 0;
  const double t0 = NowSeconds(), cpu0 = ProcessCpuSeconds();
  if (!sliced) {
    for (int p = 0; p < kConcurrentPolicies; ++p) {
      for (int64_t s = 0; s < f.steps; ++s) {
        LORADB_ASSIGN_OR_RETURN(auto r, trainer::TrainStep(&t, {{p, task.get()}}, sc));
        sample_s += r[0].sample_s;
        fb_s += r[0].forward_backward_s;
        optim_s += r[0].optim_s;
        ++cohort_steps;
      }
    }
  } else {
    std::vector<std::pair<int, const trainer::Task*>> all;
    for (int p = 0; p < kConcurrentPolicies; ++p) all.push_back({p, task.get()});
    trainer::TimeSliceOptions to;
    to.steps = f.steps;
    to.workers = f.workers;
    to.max_cohort = f.cohort;
    LORADB_ASSIGN_OR_RETURN(trainer::TimeSliceResult r, trainer::TrainTimeSliced(&t, all, sc, to));
    sample_s = r.sample_s;
    fb_s = r.forward_backward_s;
    optim_s = r.optim_s;
    cohort_steps = r.cohort_steps;
  }
  const double seconds = NowSeconds() - t0, cpu_seconds = ProcessCpuSeconds() - cpu0;
  Emit({{"bench", "train"},
        {"case", "concurrent"},
        {"mode", f.child_mode},
        {"policies", kConcurrentPolicies},
        {"steps_per_policy", f.steps},
        {"rollouts_per_step", sc.grpo_prompts * sc.grpo_group},
        {"micro_batches", sc.micro_batches},
        {"workers", sliced ? std::min<int64_t>(f.workers, kConcurrentPolicies) : 1},
        {"train_step_calls", cohort_steps},
        {"threads", at::get_num_threads()},
        {"wall_s", seconds},
        {"cpu_s", cpu_seconds},
        {"sample_s", sample_s},
        {"forward_backward_s", fb_s},
        {"optim_s", optim_s},
        {"loss_forward_rows", t.loss_forward_rows()},
        {"peak_rss_bytes", PeakRssBytes()}});
  return absl::OkStatus();
}

absl::Status RunConcurrent(const Flags& f) {
  if (!f.child_mode.empty()) return RunConcurrentChild(f);
  ScratchDir scratch;
  if (scratch.path().empty()) return absl::InternalError("cannot create a scratch directory");
  LORADB_RETURN_IF_ERROR(model::WriteRandomCheckpoint(TinyDense(), scratch.path(), 1, at::kFloat));
  std::error_code ec;
  const std::string self = fs::read_symlink("/proc/self/exe", ec).string();
  if (ec) return absl::InternalError("cannot find this program (/proc/self/exe)");
  // Each mode in its own child process, so neither inherits the other's peak RSS.
  auto run_child = [&](const std::string& mode, int64_t threads, double* seconds,
                       int64_t* rss) -> absl::Status {
    Progress(absl::StrCat("concurrent: ", mode, ", ", threads, " intra-op thread(s) (child)"));
    const std::string cmd =
        absl::StrCat("'", self, "' train concurrent --steps ", f.steps, " --threads ", threads,
                     " --prompts ", f.prompts, " --group ", f.group, " --sliced-micro-batches ",
                     f.sliced_micro_batches, " --workers ", f.workers, " --cohort ", f.cohort,
                     " --child-mode ", mode, " --child-base '", scratch.path(), "'");
    LORADB_ASSIGN_OR_RETURN(JsonCommandResult r, RunJsonCommand(cmd, "wall_s"));
    if (r.exit_status != 0) {
      return absl::InternalError(absl::StrCat(cmd, " failed (exit status ", r.exit_status, ")"));
    }
    const nlohmann::json& j = r.last_object;
    if (!j.contains("peak_rss_bytes")) return absl::InternalError(cmd + " printed no measurement");
    *seconds = j["wall_s"].get<double>();
    *rss = j["peak_rss_bytes"].get<int64_t>();
    Emit(j);
    return absl::OkStatus();
  };
  const double load0 = LoadAverage1m();
  // The sequential arm gets the cores the time-sliced arm's workers use, as intra-op threads:
  // the speedup must come from scheduling, not from more cores. The arms alternate `repeats`
  // times and their medians are compared, so a drift in what the machine gives (the two-thread
  // arm is the more sensitive to a busy neighbour) does not land on one arm only.
  const int64_t seq_threads = f.threads * f.workers;
  std::vector<double> seq_runs, sliced_runs;
  std::vector<int64_t> seq_rss_runs, sliced_rss_runs;
  for (int64_t r = 0; r < f.repeats; ++r) {
    double seq_s = 0, sliced_s = 0;
    int64_t seq_rss = 0, sliced_rss = 0;
    LORADB_RETURN_IF_ERROR(run_child("sequential", seq_threads, &seq_s, &seq_rss));
    LORADB_RETURN_IF_ERROR(run_child("time_sliced", f.threads, &sliced_s, &sliced_rss));
    seq_runs.push_back(seq_s);
    sliced_runs.push_back(sliced_s);
    seq_rss_runs.push_back(seq_rss);
    sliced_rss_runs.push_back(sliced_rss);
  }
  auto median = [](auto v) {
    std::sort(v.begin(), v.end());
    return static_cast<double>(v[v.size() / 2]);
  };
  std::vector<double> pair_ratios;
  for (size_t r = 0; r < seq_runs.size(); ++r) pair_ratios.push_back(seq_runs[r] / sliced_runs[r]);
  const double ratio = median(seq_runs) / median(sliced_runs);
  const double rss_ratio = median(sliced_rss_runs) / median(seq_rss_runs);
  nlohmann::json summary = {
      {"bench", "train"},
      {"case", "concurrent_summary"},
      {"threads", f.threads},
      {"workers", f.workers},
      {"sequential_threads", seq_threads},
      {"repeats", f.repeats},
      {"sequential_median_s", median(seq_runs)},
      {"time_sliced_median_s", median(sliced_runs)},
      {"speedup", ratio},
      {"speedup_min_pair", *std::min_element(pair_ratios.begin(), pair_ratios.end())},
      {"speedup_max_pair", *std::max_element(pair_ratios.begin(), pair_ratios.end())},
      {"peak_rss_ratio", rss_ratio},
      {"loadavg_1m_start", load0},
      {"loadavg_1m_end", LoadAverage1m()}};
  if (f.reference_threads > 0) {
    // The sequential arm again, with another intra-op thread count.
    double ref_s = 0;
    int64_t ref_rss = 0;
    LORADB_RETURN_IF_ERROR(run_child("sequential", f.reference_threads, &ref_s, &ref_rss));
    summary["sequential_reference_threads"] = f.reference_threads;
    summary["speedup_vs_sequential_reference"] = ref_s / median(sliced_runs);
  }
  Emit(summary);
  EmitGoal("train", "concurrent_speedup", ratio, ">= 1.5", ratio >= 1.5);
  EmitGoal("train", "concurrent_peak_rss_ratio", rss_ratio, "within 10% (0.9..1.1)",
           std::abs(rss_ratio - 1.0) <= 0.1);
  return absl::OkStatus();
}

absl::Status RunTrainBench(const std::vector<std::string>& args) {
  LORADB_ASSIGN_OR_RETURN(Flags f, ParseTrainFlags(args));
  // Intra-op threads of both arms (default 1: on this shared 2-core machine OpenMP threads
  // oversubscribe, and the tiny model's ops gain little from more).
  at::set_num_threads(static_cast<int>(f.threads));
  // As `loradb train` runs the trainer.
  model::EnableCpuBlockCache(model::DefaultCpuBlockCacheBytes());
  if (f.which == "all" || f.which == "concurrent") LORADB_RETURN_IF_ERROR(RunConcurrent(f));
  if (!f.child_mode.empty()) return absl::OkStatus();
  if (f.which == "all" || f.which == "handoff") LORADB_RETURN_IF_ERROR(RunHandoff(f));
  return absl::OkStatus();
}

LORADB_REGISTER_SCENARIO(
    {"train",
     "trainer: handoff (revision vs merged checkpoint), concurrent (K=3 "
     "GRPO policies sequential vs time-sliced) [--layers N] [--steps N] "
     "[--threads N] [--workers N] [--cohort N] [--reference-threads N] [--repeats N]",
     RunTrainBench,
     {"--layers", "28", "--steps", "10"}});

}  // namespace
}  // namespace loradb::bench

#endif  // LORADB_COMPUTE_AVAILABLE
