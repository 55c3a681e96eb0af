#include "compute/decoder/decode_bench_tools.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/core/InferenceMode.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <optional>
#include <random>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "compute/decoder/decoder.h"
#include "compute/model/checkpoint.h"
#include "compute/model/dense_linear.h"
#include "compute/model/kernel_lora_applier.h"
#include "compute/model/qwen3_model.h"
#include "storage/formats/peft.h"
#include "storage/util/status_macros.h"

namespace loradb::decoder {
namespace {

double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

struct BenchAdapter {
  std::map<std::string, std::pair<at::Tensor, at::Tensor>> factors;  // module key -> (A, B)
  double scale = 1;
};

}  // namespace

struct DecodeBenchHarness::State {
  ModelConfig config;
  std::string model_dir;
  std::unique_ptr<model::Qwen3Model> model;
  std::unique_ptr<model::KernelLoraApplier> applier;
  std::unique_ptr<Store> store;
  std::unique_ptr<Decoder> decoder;
  std::vector<BenchAdapter> adapters;
  std::shared_ptr<const TensorSet> base_tensors;
  uint64_t adapter_bytes = 0;
  uint64_t prompt_seed = 1;
};

DecodeBenchHarness::DecodeBenchHarness(std::unique_ptr<State> state) : s_(std::move(state)) {}
DecodeBenchHarness::~DecodeBenchHarness() = default;

int64_t DecodeBenchHarness::num_parameters() const { return s_->model->num_parameters(); }
uint64_t DecodeBenchHarness::adapter_bytes() const { return s_->adapter_bytes; }

absl::StatusOr<std::unique_ptr<DecodeBenchHarness>> DecodeBenchHarness::Create(
    const std::string& config_path, const std::string& work_dir, int64_t max_adapters, int64_t rank,
    int lora_threads, int torch_threads) {
  if (torch_threads > 0) at::set_num_threads(torch_threads);
  c10::InferenceMode inference;
  auto s = std::make_unique<State>();
  LORADB_ASSIGN_OR_RETURN(s->config, ReadModelConfig(config_path));
  s->model_dir = work_dir + "/model";
  LORADB_RETURN_IF_ERROR(model::WriteRandomCheckpoint(s->config, s->model_dir, 1, at::kFloat));
  LORADB_ASSIGN_OR_RETURN(s->model, model::Qwen3Model::Load(s->model_dir));
  s->applier = std::make_unique<model::KernelLoraApplier>(lora_threads);
  s->model->set_lora_applier(s->applier.get());
  LORADB_ASSIGN_OR_RETURN(TensorSet base, model::ReadCheckpointTensors(s->model_dir));
  s->base_tensors = std::make_shared<const TensorSet>(std::move(base));
  LORADB_ASSIGN_OR_RETURN(s->store, Store::Open(work_dir + "/store"));
  LORADB_RETURN_IF_ERROR(s->store
                             ->AddBaseFromConfig("bench", s->model_dir + "/config.json",
                                                 s->model_dir + "/model.safetensors")
                             .status());
  at::Generator gen = at::detail::createCPUGenerator(7);
  for (int64_t i = 0; i < max_adapters; ++i) {
    BenchAdapter a;
    a.scale = 2.0;  // alpha 2r / r
    std::vector<TensorView> views;
    for (const ModuleShape& m : s->config.LoraModules()) {
      const bool proj = m.name.find("_proj") != std::string::npos;
      if (!proj) continue;  // embeddings, lm_head, router
      at::Tensor am = at::randn({rank, m.in}, gen, at::kFloat) * 0.02;
      at::Tensor bm = at::randn({m.out, rank}, gen, at::kFloat) * 0.02;
      const std::string key = "model." + m.name;
      a.factors[key] = {am, bm};
    }
    for (const auto& [key, ab] : a.factors) {
      for (int side = 0; side < 2; ++side) {
        const at::Tensor& x = side == 0 ? ab.first : ab.second;
        views.push_back({peft::PeftTensorNameFor(
                             key, side == 0 ? peft::LoraSide::kA : peft::LoraSide::kB, false),
                         DType::kF32, x.sizes().vec(), static_cast<const std::byte*>(x.data_ptr()),
                         x.nbytes()});
        if (i == 0) s->adapter_bytes += x.nbytes();
      }
    }
    PublishOptions o;
    o.alias = "prod";
    o.create_policy_base = "bench";
    o.lora.r = static_cast<int32_t>(rank);
    o.lora.alpha = static_cast<float>(2 * rank);
    LORADB_RETURN_IF_ERROR(s->store->PublishTensors(absl::StrCat("p", i), views, o).status());
    s->adapters.push_back(std::move(a));
  }
  // The same modules with DoRA magnitudes, and with modules_to_save lm_head, as PEFT saves them.
  const uint64_t head_bytes =
      static_cast<uint64_t>(s->config.vocab_size * s->config.hidden_size) * sizeof(float);
  for (int variant = 0; variant < 2; ++variant) {
    const BenchAdapter& src = s->adapters.empty() ? BenchAdapter() : s->adapters[0];
    std::vector<at::Tensor> keep;
    std::vector<TensorView> views;
    auto add = [&](const std::string& name, at::Tensor t) {
      t = t.contiguous();
      views.push_back({name, DType::kF32, t.sizes().vec(),
                       static_cast<const std::byte*>(t.data_ptr()), t.nbytes()});
      keep.push_back(std::move(t));
    };
    for (const auto& [key, ab] : src.factors) {
      add(peft::PeftTensorNameFor(key, peft::LoraSide::kA, false), ab.first);
      add(peft::PeftTensorNameFor(key, peft::LoraSide::kB, false), ab.second);
      if (variant == 0) {
        add(absl::StrCat("base_model.model.", key, ".lora_magnitude_vector"),
            at::rand({ab.second.size(0)}, gen, at::kFloat) + 0.5);
      }
    }
    if (variant == 1) {
      add("base_model.model.lm_head.weight",
          at::randn({s->config.vocab_size, s->config.hidden_size}, gen, at::kFloat) * 0.02);
    }
    LORADB_ASSIGN_OR_RETURN(
        peft::LoraConfig pc,
        peft::ParseLoraConfig(absl::StrCat(
            R"({"peft_type":"LORA","r":)", rank, R"(,"lora_alpha":)", 2 * rank,
            R"(,"target_modules":["q_proj","k_proj","v_proj","o_proj","gate_proj","up_proj",)",
            R"("down_proj"])",
            variant == 0 ? R"(,"use_dora":true})" : R"(,"modules_to_save":["lm_head"]})")));
    const std::string dir = absl::StrCat(work_dir, variant == 0 ? "/dora" : "/lm_head_mts");
    LORADB_RETURN_IF_ERROR(peft::WritePeftDir(dir, pc, views));
    PublishOptions o;
    o.alias = "prod";
    o.create_policy_base = "bench";
    LORADB_RETURN_IF_ERROR(
        s->store->PublishPeftDir(variant == 0 ? "dora" : "lm_head_mts", dir, o).status());
  }
  DecoderOptions dopt;
  dopt.max_running = 1024;
  dopt.max_prefill_tokens = 1 << 20;
  dopt.cpu_cache_bytes = (s->adapter_bytes + (1 << 20)) * static_cast<uint64_t>(max_adapters + 2) +
                         head_bytes + (uint64_t{64} << 20);
  dopt.device.arena_bytes = dopt.cpu_cache_bytes;
  LORADB_ASSIGN_OR_RETURN(s->decoder, Decoder::Create(s->model.get(), s->store.get(), dopt));
  return std::unique_ptr<DecodeBenchHarness>(new DecodeBenchHarness(std::move(s)));
}

namespace {

std::vector<int64_t> RandomPrompt(std::mt19937_64& rng, int64_t len, int64_t vocab) {
  std::vector<int64_t> p(static_cast<size_t>(len));
  for (auto& t : p) t = static_cast<int64_t>(rng() % static_cast<uint64_t>(vocab));
  return p;
}

// Submits the requests, times the prefill step(s) and the decode steps.
absl::Status Serve(Decoder& d, const std::vector<GenerateRequest>& reqs, DecodeBenchRun* run) {
  const DecoderStats before = d.stats();
  for (const GenerateRequest& r : reqs) LORADB_RETURN_IF_ERROR(d.Submit(r).status());
  double t0 = Now();
  // Prefill: every request's prompt goes in the first step (the budget allows it).
  LORADB_RETURN_IF_ERROR(d.Step());
  double t1 = Now();
  LORADB_RETURN_IF_ERROR(d.RunUntilIdle());
  double t2 = Now();
  const DecoderStats after = d.stats();
  run->prefill_seconds += t1 - t0;
  run->decode_seconds += t2 - t1;
  run->decode_tokens += after.decode_tokens - before.decode_tokens;
  run->steps += after.steps - before.steps;
  run->deferrals += after.deferrals - before.deferrals;
  run->adapter_builds += after.adapter_builds - before.adapter_builds;
  if (after.failed != before.failed) return absl::InternalError("a bench request failed");
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<DecodeBenchRun> DecodeBenchHarness::RunDecoder(int64_t batch, int64_t distinct,
                                                              int64_t prompt_len, int64_t steps,
                                                              const std::string& first_adapter) {
  if (distinct > static_cast<int64_t>(s_->adapters.size())) {
    return absl::InvalidArgumentError("more distinct adapters than published");
  }
  std::mt19937_64 rng(s_->prompt_seed++);
  std::vector<GenerateRequest> reqs;
  for (int64_t i = 0; i < batch; ++i) {
    GenerateRequest r;
    r.adapter = distinct > 0 ? absl::StrCat("p", i % distinct, ":prod") : "";
    if (i == 0 && !first_adapter.empty()) r.adapter = first_adapter;
    r.prompt_ids = RandomPrompt(rng, prompt_len, s_->config.vocab_size);
    r.max_new_tokens = steps + 1;
    reqs.push_back(std::move(r));
  }
  DecodeBenchRun run;
  LORADB_RETURN_IF_ERROR(Serve(*s_->decoder, reqs, &run));
  return run;
}

absl::StatusOr<DecodeBenchRun> DecodeBenchHarness::RunMerged(int64_t batch, int64_t distinct,
                                                             int64_t prompt_len, int64_t steps) {
  if (distinct < 1 || distinct > static_cast<int64_t>(s_->adapters.size())) {
    return absl::InvalidArgumentError("merge path needs 1..published adapters");
  }
  c10::InferenceMode inference;
  std::mt19937_64 rng(s_->prompt_seed++);
  std::vector<std::vector<GenerateRequest>> groups(static_cast<size_t>(distinct));
  for (int64_t i = 0; i < batch; ++i) {
    GenerateRequest r;
    r.prompt_ids = RandomPrompt(rng, prompt_len, s_->config.vocab_size);
    r.max_new_tokens = steps + 1;
    groups[static_cast<size_t>(i % distinct)].push_back(std::move(r));
  }
  DecodeBenchRun run;
  for (int64_t g = 0; g < distinct; ++g) {
    const BenchAdapter& a = s_->adapters[static_cast<size_t>(g)];
    const double t0 = Now();
    // A copy of the base with the adapter merged in.
    auto owned = std::make_shared<std::vector<at::Tensor>>();
    auto merged = std::make_shared<TensorSet>(owned);
    for (const TensorView& v : s_->base_tensors->tensors()) {
      at::Tensor w = at::from_blob(const_cast<std::byte*>(v.data), v.shape, at::kFloat).clone();
      const std::string suffix = ".weight";
      auto it = v.name.size() > suffix.size()
                    ? a.factors.find(v.name.substr(0, v.name.size() - suffix.size()))
                    : a.factors.end();
      if (it != a.factors.end()) w.add_(at::matmul(it->second.second, it->second.first), a.scale);
      owned->push_back(w);
      TensorView o = v;
      o.data = static_cast<const std::byte*>(w.data_ptr());
      LORADB_RETURN_IF_ERROR(merged->Add(std::move(o)));
    }
    LORADB_ASSIGN_OR_RETURN(std::unique_ptr<model::Qwen3Model> m,
                            model::Qwen3Model::FromTensors(s_->config, merged));
    run.merge_seconds += Now() - t0;
    DecoderOptions dopt;
    dopt.max_running = 1024;
    dopt.max_prefill_tokens = 1 << 20;
    LORADB_ASSIGN_OR_RETURN(std::unique_ptr<Decoder> d, Decoder::Create(m.get(), nullptr, dopt));
    LORADB_RETURN_IF_ERROR(Serve(*d, groups[static_cast<size_t>(g)], &run));
  }
  return run;
}

absl::StatusOr<BaseLinearTiming> DecodeBenchHarness::TimeBaseLinears(int64_t rows, int rounds,
                                                                     bool training) {
  std::optional<c10::InferenceMode> inference;
  if (!training) inference.emplace();
  BaseLinearTiming t;
  t.rows = rows;
  t.training = training;
  std::vector<at::Tensor> weights;
  for (const TensorView& v : s_->base_tensors->tensors()) {
    const bool linear =
        v.name.find("_proj.weight") != std::string::npos || v.name == "lm_head.weight";
    if (!linear || v.shape.size() != 2 || v.dtype != DType::kF32) continue;
    weights.push_back(at::from_blob(const_cast<std::byte*>(v.data), v.shape, at::kFloat));
    t.weight_bytes += v.nbytes;
  }
  if (weights.empty())
    return absl::InternalError("base linears: the checkpoint has no fp32 projections");
  t.matrices = static_cast<int64_t>(weights.size());
  std::map<int64_t, at::Tensor> inputs, grads;  // by input width, by output width
  for (const at::Tensor& w : weights) {
    if (!inputs.count(w.size(1))) {
      inputs[w.size(1)] = at::randn({rows, w.size(1)}).requires_grad_(training);
    }
    if (training && !grads.count(w.size(0))) grads[w.size(0)] = at::randn({rows, w.size(0)});
  }
  // One matrix: its output and, in training, the gradient reaching its input.
  auto apply = [&](bool ours, const at::Tensor& w) -> std::pair<at::Tensor, at::Tensor> {
    const at::Tensor& x = inputs[w.size(1)];
    at::Tensor y = ours ? model::BaseLinear(x, w) : at::linear(x, w);
    if (!training) return {y, at::Tensor()};
    y.backward(grads[w.size(0)]);
    at::Tensor dx = x.grad().clone();
    x.mutable_grad().reset();
    return {y.detach(), dx};
  };
  auto pass = [&](bool ours) {
    const double t0 = Now();
    for (const at::Tensor& w : weights) apply(ours, w);
    return Now() - t0;
  };
  const at::Tensor& x0 = inputs.begin()->second;
  const bool runs = training ? model::UsesFrozenGemm(x0, weights.front())
                             : model::UsesDenseKernel(x0, weights.front());
  if (!runs) {
    return absl::FailedPreconditionError(
        "base linears: the CPU kernels do not run here (no AVX2/AVX-512)");
  }
  auto rel = [](const at::Tensor& got, const at::Tensor& want) {
    const double scale = want.abs().max().item<double>();
    const double diff = (got - want).abs().max().item<double>();
    return scale > 0 ? diff / scale : diff;
  };
  for (const at::Tensor& w : weights) {
    const auto [want_y, want_dx] = apply(false, w);
    const auto [got_y, got_dx] = apply(true, w);
    t.max_rel_diff = std::max(t.max_rel_diff, rel(got_y, want_y));
    if (training) t.max_rel_diff = std::max(t.max_rel_diff, rel(got_dx, want_dx));
  }
  std::vector<double> dense, blas;
  for (int r = 0; r < rounds; ++r) {
    dense.push_back(pass(true));
    blas.push_back(pass(false));
  }
  auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };
  t.dense_seconds = median(dense);
  t.blas_seconds = median(blas);
  return t;
}

}  // namespace loradb::decoder
