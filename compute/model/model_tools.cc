#include "compute/model/model_tools.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/core/InferenceMode.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <optional>

#include "absl/strings/str_cat.h"
#include "compute/model/checkpoint.h"
#include "compute/model/kernel_lora_applier.h"
#include "compute/model/peft_adapter.h"
#include "compute/model/qwen3_model.h"
#include "storage/util/status_macros.h"

namespace loradb::model {
namespace {

absl::StatusOr<at::ScalarType> ParseDTypeName(const std::string& dtype) {
  if (dtype == "f32") return at::kFloat;
  if (dtype == "bf16") return at::kBFloat16;
  if (dtype == "f16") return at::kHalf;
  return absl::InvalidArgumentError(
      absl::StrCat("dtype \"", dtype, "\" is not one of f32, bf16, f16"));
}

std::string DTypeShortName(at::ScalarType t) {
  return t == at::kFloat ? "f32" : t == at::kBFloat16 ? "bf16" : t == at::kHalf ? "f16" : "?";
}

}  // namespace

absl::Status CheckDTypeName(const std::string& dtype) { return ParseDTypeName(dtype).status(); }

absl::StatusOr<Hash128> InitRandomCheckpoint(const std::string& config_path,
                                             const std::string& out_dir, uint64_t seed,
                                             const std::string& dtype,
                                             std::optional<double> lm_head_std,
                                             double* lm_head_std_used) {
  LORADB_ASSIGN_OR_RETURN(at::ScalarType st, ParseDTypeName(dtype));
  if (lm_head_std && !(std::isfinite(*lm_head_std) && *lm_head_std > 0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("lm_head std must be a finite number > 0, got ", *lm_head_std));
  }
  LORADB_ASSIGN_OR_RETURN(ModelConfig config, ReadModelConfig(config_path));
  if (lm_head_std && config.tie_word_embeddings) {
    return absl::InvalidArgumentError(
        absl::StrCat(config_path,
                     ": tie_word_embeddings is true, so there is no separate lm_head to draw "
                     "with its own std (the embeddings are the output layer)"));
  }
  const double head_std =
      config.tie_word_embeddings ? 0.0 : lm_head_std.value_or(DefaultLmHeadStd(config));
  try {
    LORADB_RETURN_IF_ERROR(
        WriteRandomCheckpoint(config, out_dir, seed, st, kDefaultInitStd, head_std));
  } catch (const c10::Error& e) {
    return absl::InternalError(absl::StrCat("init-random: ", e.what_without_backtrace()));
  }
  LORADB_ASSIGN_OR_RETURN(std::unique_ptr<Qwen3Model> model, Qwen3Model::Load(out_dir));
  if (lm_head_std_used != nullptr) *lm_head_std_used = head_std;
  return model->fingerprint();
}

absl::StatusOr<ModelSummary> DescribeModel(const std::string& model_dir) {
  LORADB_ASSIGN_OR_RETURN(std::unique_ptr<Qwen3Model> model, Qwen3Model::Load(model_dir));
  ModelSummary s;
  s.config = model->config();
  s.fingerprint = model->fingerprint();
  s.num_parameters = model->num_parameters();
  s.dtype = DTypeShortName(model->dtype());
  return s;
}

absl::StatusOr<std::vector<std::vector<float>>> ComputeLogits(const LogitsRequest& request) {
  if (request.token_ids.empty()) return absl::InvalidArgumentError("no token ids given");
  LoadOptions options;
  if (!request.dtype.empty()) {
    LORADB_ASSIGN_OR_RETURN(at::ScalarType st, ParseDTypeName(request.dtype));
    options.dtype = st;
  }
  LORADB_ASSIGN_OR_RETURN(std::unique_ptr<Qwen3Model> model,
                          Qwen3Model::Load(request.model_dir, options));
  const int64_t n = static_cast<int64_t>(request.token_ids.size());
  std::optional<LoraAdapter> adapter;
  LoraBatch lora;
  if (!request.adapter_dir.empty()) {
    LORADB_ASSIGN_OR_RETURN(adapter, LoadPeftAdapter(*model, request.adapter_dir));
    lora.adapters = {&*adapter};
  }
  std::vector<int64_t> ids = request.token_ids;
  at::Tensor all = at::from_blob(ids.data(), {n}, at::kLong).clone();
  std::vector<at::Tensor> chunks;
  if (request.prefill <= 0 || request.prefill >= n) {
    ForwardInput in;
    in.token_ids = all;
    lora.row_slot.assign(n, 0);
    if (adapter.has_value()) in.lora = &lora;
    LORADB_ASSIGN_OR_RETURN(ForwardOutput out, model->Forward(in));
    chunks.push_back(out.logits);
  } else {
    KvCache cache = model->NewKvCache();
    const KvCache::SeqId seq = cache.AddSequence();
    int64_t pos = 0;
    while (pos < n) {
      const int64_t len = pos == 0 ? request.prefill : 1;
      ForwardInput in;
      in.token_ids = all.narrow(0, pos, len);
      in.cache_seqs = {seq};
      lora.row_slot.assign(len, 0);
      if (adapter.has_value()) in.lora = &lora;
      LORADB_ASSIGN_OR_RETURN(ForwardOutput out, model->Forward(in, &cache));
      chunks.push_back(out.logits);
      pos += len;
    }
  }
  at::Tensor logits = at::cat(chunks, 0).to(at::kFloat).contiguous();
  std::vector<std::vector<float>> rows(n);
  const int64_t vocab = logits.size(1);
  const float* p = logits.data_ptr<float>();
  for (int64_t i = 0; i < n; ++i) rows[i].assign(p + i * vocab, p + (i + 1) * vocab);
  return rows;
}

absl::StatusOr<DecodeBenchResult> RunDecodeBenchmark(const DecodeBenchOptions& o) {
  if (o.batch <= 0 || o.prompt_len <= 0 || o.steps <= 0 || o.num_adapters < 0 || o.rank <= 0) {
    return absl::InvalidArgumentError("decode benchmark: sizes must be positive");
  }
  if (o.applier != "kernel" && o.applier != "torch") {
    return absl::InvalidArgumentError("decode benchmark: applier must be kernel or torch");
  }
  if (o.adapter_dtype != "f32" && o.adapter_dtype != "bf16") {
    return absl::InvalidArgumentError("decode benchmark: adapter dtype must be f32 or bf16");
  }
  const at::ScalarType adapter_dtype = o.adapter_dtype == "bf16" ? at::kBFloat16 : at::kFloat;
  LORADB_ASSIGN_OR_RETURN(std::unique_ptr<Qwen3Model> model, Qwen3Model::Load(o.model_dir));
  c10::InferenceMode inference;
  const ModelConfig& c = model->config();
  at::manual_seed(o.seed);
  std::vector<LoraAdapter> adapters;
  adapters.reserve(o.num_adapters);
  for (int64_t j = 0; j < o.num_adapters; ++j) {
    std::vector<LoraModuleInput> mods;
    for (const ModuleShape& s : c.LoraModules()) {
      if (s.name == "embed_tokens" || s.name == "lm_head" ||
          (s.name.size() > 9 && s.name.substr(s.name.size() - 9) == ".mlp.gate")) {
        continue;
      }
      mods.push_back(
          {s.name, at::randn({o.rank, s.in}) * 0.02, at::randn({s.out, o.rank}) * 0.02, 2.0});
    }
    LORADB_ASSIGN_OR_RETURN(LoraAdapter a, LoraAdapter::Create(c, std::move(mods), adapter_dtype));
    adapters.push_back(std::move(a));
  }
  if (o.threads > 0) at::set_num_threads(o.threads);
  KernelLoraApplier kernel(at::get_num_threads());
  if (o.applier == "kernel") model->set_lora_applier(&kernel);

  LoraBatch lora;
  for (const LoraAdapter& a : adapters) lora.adapters.push_back(&a);
  std::vector<int32_t> seq_slot(o.batch, -1);
  for (int64_t s = 0; s < o.batch && o.num_adapters > 0; ++s) {
    seq_slot[s] = static_cast<int32_t>(s % o.num_adapters);
  }
  KvCache cache = model->NewKvCache();
  std::vector<KvCache::SeqId> seqs;
  for (int64_t s = 0; s < o.batch; ++s) seqs.push_back(cache.AddSequence(o.prompt_len + o.steps));

  using Clock = std::chrono::steady_clock;
  auto seconds = [](Clock::time_point a, Clock::time_point b) {
    return std::chrono::duration<double>(b - a).count();
  };
  // Prefill: every sequence's prompt in one forward.
  ForwardInput pre;
  pre.token_ids = at::randint(c.vocab_size, {o.batch * o.prompt_len}, at::kLong);
  pre.seq_lens.assign(o.batch, o.prompt_len);
  pre.cache_seqs = seqs;
  pre.last_row_logits_only = true;
  for (int64_t s = 0; s < o.batch; ++s) {
    lora.row_slot.insert(lora.row_slot.end(), o.prompt_len, seq_slot[s]);
  }
  pre.lora = o.num_adapters > 0 ? &lora : nullptr;
  const auto t0 = Clock::now();
  LORADB_ASSIGN_OR_RETURN(ForwardOutput out, model->Forward(pre, &cache));
  const auto t1 = Clock::now();
  DecodeBenchResult r;
  r.prefill_tokens_per_s = static_cast<double>(o.batch * o.prompt_len) / seconds(t0, t1);

  lora.row_slot = seq_slot;
  std::vector<double> step_s;
  double total = 0;
  at::Tensor next = out.logits.argmax(-1);
  for (int64_t step = 0; step < o.steps; ++step) {
    ForwardInput in;
    in.token_ids = next;
    in.seq_lens.assign(o.batch, 1);
    in.cache_seqs = seqs;
    in.lora = pre.lora;
    const auto a = Clock::now();
    LORADB_ASSIGN_OR_RETURN(ForwardOutput o2, model->Forward(in, &cache));
    next = o2.logits.argmax(-1);
    const auto b = Clock::now();
    step_s.push_back(seconds(a, b));
    total += seconds(a, b);
  }
  std::sort(step_s.begin(), step_s.end());
  r.decode_tokens_per_s = static_cast<double>(o.batch * o.steps) / total;
  r.decode_step_ms_p50 = 1000.0 * step_s[step_s.size() / 2];
  r.kernel_calls = kernel.kernel_calls();
  r.fallback_calls = kernel.fallback_calls();
  return r;
}

}  // namespace loradb::model
