// loradb-bench train: the trainer's two published comparisons (issue 7).
//   handoff     hand a rank-32 policy trained on a Qwen3-0.6B-shaped random base (bf16, CPU) to
//               a decoder (a) as an adapter revision: publish (bf16, source = checkpoint, alias
//               moved) + acquire (resolve the alias, read the blob, build the model's adapter),
//               vs (b) merging it into the base, writing the full safetensors checkpoint and
//               loading that into a fresh model. Goal: (a) >= 18.3x faster than (b).
//   concurrent  K = 3 GRPO policies for the same number of steps each, one after another vs
//               time-sliced (shared rollout decode batches and shared forward/backward). Goals:
//               wall-time ratio >= 1.5 and peak RSS within 10%.
// Flags: --layers N (handoff base depth, default 28 = Qwen3-0.6B), --steps N (concurrent, 10).
#ifdef LORADB_COMPUTE_AVAILABLE

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <ATen/core/grad_mode.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "bench/bench_util.h"
#include "compute/model/checkpoint.h"
#include "compute/model/qwen3_model.h"
#include "compute/trainer/checkpoint.h"
#include "compute/trainer/tasks.h"
#include "compute/trainer/tensor_io.h"
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
  int64_t steps = 10;
};

absl::StatusOr<Flags> ParseFlags(const std::vector<std::string>& args) {
  Flags f;
  for (size_t i = 0; i < args.size(); ++i) {
    auto value = [&](int64_t* out) -> absl::Status {
      if (i + 1 >= args.size() || !absl::SimpleAtoi(args[i + 1], out) || *out < 1) {
        return absl::InvalidArgumentError(absl::StrCat(args[i], " needs a positive integer"));
      }
      ++i;
      return absl::OkStatus();
    };
    if (args[i] == "--layers") {
      LORADB_RETURN_IF_ERROR(value(&f.layers));
    } else if (args[i] == "--steps") {
      LORADB_RETURN_IF_ERROR(value(&f.steps));
    } else if (args[i] == "handoff" || args[i] == "concurrent") {
      f.which = args[i];
    } else {
      return absl::InvalidArgumentError(absl::StrCat("unknown argument ", args[i]));
    }
  }
  return f;
}

// Peak RSS since the last ResetPeakRss (Linux clear_refs "5"), in bytes.
void ResetPeakRss() { std::ofstream("/proc/self/clear_refs") << "5"; }
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

absl::Status RunConcurrent(const Flags& f) {
  ScratchDir scratch;
  if (scratch.path().empty()) return absl::InternalError("cannot create a scratch directory");
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
  LORADB_RETURN_IF_ERROR(model::WriteRandomCheckpoint(config, scratch.path(), 1, at::kFloat));
  LORADB_ASSIGN_OR_RETURN(auto base, model::Qwen3Model::Load(scratch.path()));
  LORADB_ASSIGN_OR_RETURN(auto task, trainer::MakeTask("arithmetic", config.vocab_size, 1));
  trainer::StepConfig sc;
  sc.grpo_prompts = 8;
  sc.grpo_group = 8;
  constexpr int kPolicies = 3;
  auto make = [&](Trainer* t) -> absl::Status {
    for (int i = 0; i < kPolicies; ++i) {
      trainer::PolicyOptions po;
      po.name = absl::StrCat("bench/p", i);
      po.seed = static_cast<uint64_t>(i + 1);
      po.schedule.lr = 1e-3;
      LORADB_RETURN_IF_ERROR(t->AddPolicy(po).status());
    }
    return absl::OkStatus();
  };
  double seconds[2] = {0, 0};
  int64_t rss[2] = {0, 0};
  for (int mode = 0; mode < 2; ++mode) {
    Trainer t(base.get());
    LORADB_RETURN_IF_ERROR(make(&t));
    ResetPeakRss();
    const double t0 = NowSeconds();
    if (mode == 0) {
      for (int p = 0; p < kPolicies; ++p) {
        for (int64_t s = 0; s < f.steps; ++s) {
          LORADB_RETURN_IF_ERROR(trainer::TrainStep(&t, {{p, task.get()}}, sc).status());
        }
      }
    } else {
      std::vector<std::pair<int, const trainer::Task*>> all;
      for (int p = 0; p < kPolicies; ++p) all.push_back({p, task.get()});
      for (int64_t s = 0; s < f.steps; ++s) {
        LORADB_RETURN_IF_ERROR(trainer::TrainStep(&t, all, sc).status());
      }
    }
    seconds[mode] = NowSeconds() - t0;
    rss[mode] = PeakRssBytes();
    Emit({{"bench", "train"},
          {"case", "concurrent"},
          {"mode", mode == 0 ? "sequential" : "time_sliced"},
          {"policies", kPolicies},
          {"steps_per_policy", f.steps},
          {"rollouts_per_step", sc.grpo_prompts * sc.grpo_group},
          {"wall_s", seconds[mode]},
          {"peak_rss_bytes", rss[mode]}});
  }
  const double ratio = seconds[0] / seconds[1];
  const double rss_ratio = static_cast<double>(rss[1]) / static_cast<double>(rss[0]);
  EmitGoal("train", "concurrent_speedup", ratio, ">= 1.5", ratio >= 1.5);
  EmitGoal("train", "concurrent_peak_rss_ratio", rss_ratio, "within 10% (0.9..1.1)",
           std::abs(rss_ratio - 1.0) <= 0.1);
  return absl::OkStatus();
}

absl::Status RunTrainBench(const std::vector<std::string>& args) {
  LORADB_ASSIGN_OR_RETURN(Flags f, ParseFlags(args));
  at::set_num_threads(2);
  if (f.which == "all" || f.which == "concurrent") LORADB_RETURN_IF_ERROR(RunConcurrent(f));
  if (f.which == "all" || f.which == "handoff") LORADB_RETURN_IF_ERROR(RunHandoff(f));
  return absl::OkStatus();
}

LORADB_REGISTER_SCENARIO({"train",
                          "trainer: handoff (revision vs merged checkpoint), concurrent (K=3 "
                          "GRPO policies sequential vs time-sliced) [--layers N] [--steps N]",
                          RunTrainBench,
                          {"--layers", "28", "--steps", "10"}});

}  // namespace
}  // namespace loradb::bench

#endif  // LORADB_COMPUTE_AVAILABLE
