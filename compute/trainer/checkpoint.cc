#include "compute/trainer/checkpoint.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "compute/model/torch_dtype.h"
#include "compute/trainer/tensor_io.h"
#include "storage/formats/peft.h"
#include "storage/formats/peft_experts.h"
#include "storage/store/lora_peft.h"
#include "storage/util/status_macros.h"

namespace loradb::trainer {
namespace {

constexpr char kMicroSteps[] = "trainer.micro_steps";
constexpr char kLoraRank[] = "trainer.lora_rank";
constexpr char kLoraAlpha[] = "trainer.lora_alpha";
constexpr char kLoraRsLora[] = "trainer.lora_use_rslora";

// Removes the one-element tensor `name` from `part` into *out; false when absent.
bool TakeScalar(std::map<std::string, at::Tensor>* part, const std::string& name, at::Tensor* out) {
  auto it = part->find(name);
  if (it == part->end() || it->second.numel() != 1) return false;
  *out = it->second;
  part->erase(it);
  return true;
}

absl::StatusOr<std::map<std::string, at::Tensor>> ReadPart(const Store& store, const BlobRef& ref,
                                                           at::ScalarType dtype) {
  std::map<std::string, at::Tensor> out;
  if (ref.bytes == 0) return out;
  LORADB_ASSIGN_OR_RETURN(TensorSet set, store.ReadCheckpointTensors(ref));
  for (const TensorView& v : set.tensors()) {
    const bool integer = v.dtype == DType::kI64 || v.dtype == DType::kI32;
    LORADB_ASSIGN_OR_RETURN(out[v.name], FromView(v, integer                  ? at::kLong
                                                     : v.dtype == DType::kF64 ? at::kDouble
                                                                              : dtype));
  }
  return out;
}

}  // namespace

absl::Status EnsurePolicy(Store* store, const std::string& base_name, const std::string& model_dir,
                          const std::string& policy) {
  if (!store->GetBase(base_name).ok()) {
    LORADB_RETURN_IF_ERROR(
        store->AddBaseFromConfig(base_name, model_dir + "/config.json").status());
  }
  auto existing = store->GetPolicy(policy);
  if (existing.ok()) {
    if (existing->base != base_name) {
      return absl::FailedPreconditionError(absl::StrCat("policy ", policy, " is bound to base ",
                                                        existing->base, ", not ", base_name));
    }
    return absl::OkStatus();
  }
  if (existing.status().code() != absl::StatusCode::kNotFound) return existing.status();
  return store->CreatePolicy(policy, base_name).status();
}

absl::StatusOr<CheckpointRecord> SaveCheckpoint(Store* store, const Trainer& trainer, int policy,
                                                uint64_t parent, const std::string& rollout) {
  LORADB_ASSIGN_OR_RETURN(PolicySnapshot snap, trainer.Snapshot(policy));
  std::map<std::string, at::Tensor> optimizer, gradients;
  for (const auto& [name, t] : snap.optimizer) optimizer[name] = t;
  // Integers are stored as I64, floats as F32: write the two kinds as separate view sets.
  LORADB_ASSIGN_OR_RETURN(OwnedTensorViews master, ToViews(snap.master, DType::kF32));
  std::map<std::string, at::Tensor> opt_float, opt_int;
  for (const auto& [name, t] : optimizer) {
    (t.scalar_type() == at::kLong ? opt_int : opt_float)[name] = t;
  }
  LORADB_ASSIGN_OR_RETURN(OwnedTensorViews opt_f, ToViews(opt_float, DType::kF32));
  LORADB_ASSIGN_OR_RETURN(OwnedTensorViews opt_i, ToViews(opt_int, DType::kI64));
  LORADB_ASSIGN_OR_RETURN(OwnedTensorViews grads, ToViews(snap.gradients, DType::kF32));
  LORADB_ASSIGN_OR_RETURN(
      OwnedTensorViews micro,
      ToViews({{kMicroSteps, at::full({1}, snap.micro_steps, at::kLong)},
               {kLoraRank, at::full({1}, snap.lora_rank, at::kLong)},
               {kLoraRsLora, at::full({1}, snap.use_rslora ? 1 : 0, at::kLong)}},
              DType::kI64));
  LORADB_ASSIGN_OR_RETURN(
      OwnedTensorViews alpha,
      ToViews({{kLoraAlpha, at::full({1}, snap.lora_alpha, at::kDouble)}}, DType::kF64));

  CheckpointParts parts;
  parts.master = master.views;
  parts.optimizer = opt_f.views;
  parts.optimizer.insert(parts.optimizer.end(), opt_i.views.begin(), opt_i.views.end());
  parts.gradients = micro.views;
  parts.gradients.insert(parts.gradients.end(), alpha.views.begin(), alpha.views.end());
  parts.gradients.insert(parts.gradients.end(), grads.views.begin(), grads.views.end());
  parts.scheduler_name = snap.scheduler_name;
  parts.scheduler_position = snap.scheduler_position;
  parts.rng_state = snap.rng_state;
  parts.rollout = rollout;
  return store->PutCheckpoint(trainer.options(policy).name,
                              static_cast<uint64_t>(snap.scheduler_position), parent, parts);
}

absl::Status LoadCheckpoint(const Store& store, Trainer* trainer, int policy, uint64_t id) {
  if (policy < 0 || policy >= trainer->num_policies()) {
    return absl::InvalidArgumentError(absl::StrCat("no policy index ", policy));
  }
  LORADB_ASSIGN_OR_RETURN(CheckpointRecord rec, store.GetCheckpoint(id));
  LORADB_ASSIGN_OR_RETURN(PolicyRecord pol, store.GetPolicy(trainer->options(policy).name));
  if (rec.policy_id != pol.id) {
    return absl::InvalidArgumentError(
        absl::StrCat("checkpoint ", id, " belongs to another policy"));
  }
  LORADB_ASSIGN_OR_RETURN(PolicySnapshot snap, ReadSnapshot(store, rec));
  return trainer->Restore(policy, snap);
}

absl::StatusOr<PolicySnapshot> ReadSnapshot(const Store& store, const CheckpointRecord& rec) {
  const uint64_t id = rec.id;
  PolicySnapshot snap;
  LORADB_ASSIGN_OR_RETURN(snap.master, ReadPart(store, rec.master, at::kFloat));
  LORADB_ASSIGN_OR_RETURN(snap.optimizer, ReadPart(store, rec.optimizer, at::kFloat));
  LORADB_ASSIGN_OR_RETURN(snap.gradients, ReadPart(store, rec.gradients, at::kFloat));
  auto micro = snap.gradients.find(kMicroSteps);
  if (micro == snap.gradients.end() || micro->second.numel() != 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("checkpoint ", id, " has no ", kMicroSteps, " in its gradients blob"));
  }
  snap.micro_steps = micro->second.item<int64_t>();
  snap.gradients.erase(micro);
  // LoRA scaling (absent in checkpoints written before it was recorded).
  at::Tensor rank, alpha, rslora;
  const bool has_rank = TakeScalar(&snap.gradients, kLoraRank, &rank);
  const bool has_alpha = TakeScalar(&snap.gradients, kLoraAlpha, &alpha);
  const bool has_rslora = TakeScalar(&snap.gradients, kLoraRsLora, &rslora);
  if (has_rank != has_alpha || has_alpha != has_rslora) {
    return absl::InvalidArgumentError(
        absl::StrCat("checkpoint ", id, " records only part of its LoRA scaling"));
  }
  if (has_alpha) {
    snap.lora_rank = rank.item<int64_t>();
    snap.lora_alpha = alpha.item<double>();
    snap.use_rslora = rslora.item<int64_t>() != 0;
  }
  snap.scheduler_name = rec.scheduler_name;
  snap.scheduler_position = rec.scheduler_position;
  snap.rng_state = rec.rng_state;
  return snap;
}

absl::StatusOr<CheckpointRecord> LatestCheckpoint(const Store& store, const std::string& policy) {
  LORADB_ASSIGN_OR_RETURN(PolicyRecord pol, store.GetPolicy(policy));
  LORADB_ASSIGN_OR_RETURN(std::vector<CheckpointRecord> all,
                          store.catalog().ListCheckpoints(pol.id));
  if (all.empty())
    return absl::NotFoundError(absl::StrCat("policy ", policy, " has no checkpoint"));
  return *std::max_element(all.begin(), all.end(), [](const auto& a, const auto& b) {
    return std::make_pair(a.step, a.id) < std::make_pair(b.step, b.id);
  });
}

absl::StatusOr<RevisionRecord> PublishForSampling(Store* store, const Trainer& trainer, int policy,
                                                  uint64_t checkpoint_id, const std::string& alias,
                                                  DType dtype) {
  LORADB_ASSIGN_OR_RETURN(at::ScalarType st, model::TorchScalarType(dtype));
  LORADB_ASSIGN_OR_RETURN(auto weights, trainer.ExportWeights(policy, st));
  LORADB_ASSIGN_OR_RETURN(OwnedTensorViews views, ToViews(weights, dtype));
  const LoraConfig& lora = trainer.options(policy).lora;
  PublishOptions opts;
  // The store's `latest` always names the newest live revision: publishing moves it.
  if (alias != "latest") opts.alias = alias;
  opts.source.kind = SourceKind::kTrained;
  opts.source.checkpoint_id = checkpoint_id;
  opts.source.step = static_cast<uint64_t>(trainer.step(policy));
  opts.lora.r = static_cast<int32_t>(lora.rank);
  opts.lora.alpha = static_cast<float>(lora.alpha);
  opts.lora.use_rslora = lora.use_rslora;
  opts.lora.target_modules = lora.target_modules;
  if (lora.target_parameters.empty()) {
    return store->PublishTensors(trainer.options(policy).name, views.views, opts);
  }
  // LoRA on fused expert parameters: published as the PEFT adapter it is (target_parameters
  // layout, its config kept for export), stored per expert like an imported one.
  peft::PeftAdapter adapter;
  adapter.config = ToPeftConfig(opts.lora);
  adapter.config.target_parameters = lora.target_parameters;
  adapter.config.task_type = "CAUSAL_LM";
  TensorSet per_expert;
  per_expert.Reserve(views.views.size());
  for (const TensorView& v : views.views) LORADB_RETURN_IF_ERROR(per_expert.Add(v));
  const ModelConfig& base = trainer.model().config();
  LORADB_ASSIGN_OR_RETURN(
      adapter.tensors,
      peft::FuseTargetParameters(adapter.config, per_expert,
                                 peft::Qwen3MoeExpertsLayout(base.num_experts, base.hidden_size,
                                                             base.moe_intermediate_size)));
  return store->PublishPeft(trainer.options(policy).name, adapter, opts);
}

absl::Status SetReferenceFromRevision(const Store& store, Trainer* trainer, int policy,
                                      const std::string& ref) {
  if (policy < 0 || policy >= trainer->num_policies()) {
    return absl::InvalidArgumentError(absl::StrCat("no policy index ", policy));
  }
  LORADB_ASSIGN_OR_RETURN(RevisionRecord rev, store.Resolve(ref));
  if (rev.state != RevisionState::kLive) {
    return absl::FailedPreconditionError(absl::StrCat("revision ", rev.id, " is deleted"));
  }
  LORADB_ASSIGN_OR_RETURN(PolicyRecord pol, store.GetPolicy(trainer->options(policy).name));
  if (rev.base != pol.base) {
    return absl::FailedPreconditionError(absl::StrCat("reference ", ref, " (revision ", rev.id,
                                                      ") is on base ", rev.base, ", policy ",
                                                      pol.name, " on ", pol.base));
  }
  // The revision's scales as PEFT computes them (alpha / r or / sqrt(r), per-module patterns).
  const peft::LoraConfig config = ToPeftConfig(rev.lora);
  LORADB_ASSIGN_OR_RETURN(TensorSet set, store.ReadTensors(rev));
  // A PEFT feature the trainer does not apply refuses the reference by name (never dropped).
  std::vector<std::string> names;
  for (const TensorView& v : set.tensors()) names.push_back(v.name);
  LORADB_ASSIGN_OR_RETURN(uint32_t features,
                          peft::StoredAdapterFeatures(config, set.metadata(), names));
  LORADB_RETURN_IF_ERROR(peft::RefuseUnapplied(
      features, /*applied=*/0, absl::StrCat("the trainer (reference revision ", rev.id, ")")));
  struct Pair {
    std::string key;
    at::Tensor a, b;
  };
  std::map<std::string, Pair> modules;
  for (const TensorView& v : set.tensors()) {
    LORADB_ASSIGN_OR_RETURN(peft::PeftTensorName name, peft::ParsePeftTensorName(v.name));
    if (name.embedding) {
      return absl::UnimplementedError(
          absl::StrCat("reference revision ", rev.id, ": LoRA on embeddings (", v.name, ")"));
    }
    Pair& p = modules[name.module];
    p.key = name.module_key;
    LORADB_ASSIGN_OR_RETURN((name.side == peft::LoraSide::kA ? p.a : p.b), FromView(v, at::kFloat));
  }
  std::vector<model::LoraModuleInput> inputs;
  for (auto& [module, p] : modules) {
    if (!p.a.defined() || !p.b.defined()) {
      return absl::InvalidArgumentError(absl::StrCat("reference revision ", rev.id, ": module ",
                                                     module, " lacks lora_A or lora_B"));
    }
    inputs.push_back({module, p.a, p.b, config.ScaleFor(p.key)});
  }
  if (inputs.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("reference revision ", rev.id, " has no LoRA tensors"));
  }
  return trainer->SetReference(policy, std::move(inputs));
}

}  // namespace loradb::trainer
