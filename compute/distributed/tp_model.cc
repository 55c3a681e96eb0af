#include "compute/distributed/tp_model.h"

#include <map>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "compute/model/checkpoint.h"
#include "compute/model/torch_dtype.h"
#include "storage/util/status_macros.h"

namespace loradb::distributed {
absl::StatusOr<std::unique_ptr<model::Qwen3Model>> LoadTpModel(const std::string& dir,
                                                               const TpShardSpec& spec,
                                                               const model::LoadOptions& options) {
  LORADB_RETURN_IF_ERROR(ValidateTpShard(spec));
  LORADB_ASSIGN_OR_RETURN(ModelConfig config, ReadModelConfig(dir));
  LORADB_ASSIGN_OR_RETURN(ModelConfig local, TpLocalConfig(config, spec.degree));
  LORADB_ASSIGN_OR_RETURN(TensorSet whole, model::ReadCheckpointTensors(dir));
  LORADB_ASSIGN_OR_RETURN(TensorSet shard, ShardBaseCheckpoint(config, whole, spec));
  return model::Qwen3Model::FromTensors(local, std::make_shared<const TensorSet>(std::move(shard)),
                                        options);
}

namespace {

// One LoRA factor in memory the adapter reads (a shard buffer or a device slot).
struct FactorView {
  const std::string* name;
  DType dtype;
  const std::vector<int64_t>* shape;
  const std::byte* data;
};

absl::StatusOr<model::LoraAdapter> BuildFromViews(const model::Qwen3Model& local_model,
                                                  const std::vector<FactorView>& views,
                                                  const peft::LoraConfig& config,
                                                  at::Device where) {
  struct Pair {
    std::string key;
    at::Tensor a, b;
  };
  std::map<std::string, Pair> modules;
  for (const FactorView& t : views) {
    LORADB_ASSIGN_OR_RETURN(peft::PeftTensorName name, peft::ParsePeftTensorName(*t.name));
    if (name.embedding) {
      return absl::UnimplementedError(absl::StrCat("LoRA on embeddings (", *t.name, ")"));
    }
    LORADB_ASSIGN_OR_RETURN(
        at::ScalarType st,
        model::TorchFloatScalarType(t.dtype, absl::StrCat("adapter tensor ", *t.name)));
    // A view over the shard's memory (never written through); its owner keeps it alive.
    at::Tensor view = at::from_blob(const_cast<std::byte*>(t.data), *t.shape,
                                    at::TensorOptions(st).device(where));
    Pair& p = modules[name.module];
    p.key = name.module_key;
    (name.side == peft::LoraSide::kA ? p.a : p.b) = view;
  }
  std::vector<model::LoraModuleInput> inputs;
  inputs.reserve(modules.size());
  for (auto& [module, p] : modules) {
    if (!p.a.defined() || !p.b.defined()) {
      return absl::InvalidArgumentError(
          absl::StrCat("adapter module ", module, " lacks lora_A or lora_B"));
    }
    inputs.push_back({module, p.a, p.b, config.ScaleFor(p.key)});
  }
  return model::LoraAdapter::Create(local_model.config(), std::move(inputs), local_model.dtype(),
                                    local_model.device());
}

}  // namespace

absl::StatusOr<std::unique_ptr<TpAdapter>> BuildTpAdapter(const model::Qwen3Model& local_model,
                                                          TensorSet shard,
                                                          const peft::LoraConfig& config) {
  std::vector<FactorView> views;
  views.reserve(shard.size());
  for (const TensorView& t : shard.tensors()) views.push_back({&t.name, t.dtype, &t.shape, t.data});
  LORADB_ASSIGN_OR_RETURN(model::LoraAdapter adapter,
                          BuildFromViews(local_model, views, config, at::kCPU));
  return std::make_unique<TpAdapter>(TpAdapter{std::move(shard), std::move(adapter)});
}

absl::StatusOr<model::LoraAdapter> BuildTpAdapterFromSlot(const model::Qwen3Model& local_model,
                                                          const tiers::DeviceAdapter& slot,
                                                          const TpShardSpec& spec,
                                                          const peft::LoraConfig& config,
                                                          at::Device slot_device) {
  if (slot.tp.rank != spec.rank || slot.tp.degree != spec.degree) {
    return absl::FailedPreconditionError(absl::StrCat(
        "revision ", slot.revision, " is resident as the shard of TP rank ", slot.tp.rank, " of ",
        slot.tp.degree, ", this model is rank ", spec.rank, " of ", spec.degree));
  }
  std::vector<FactorView> views;
  views.reserve(slot.tensors.size());
  for (const tiers::DeviceTensor& t : slot.tensors) {
    views.push_back({&t.name, t.dtype, &t.shape, t.data});
  }
  absl::StatusOr<model::LoraAdapter> adapter =
      BuildFromViews(local_model, views, config, slot_device);
  if (!adapter.ok()) {
    return absl::Status(adapter.status().code(),
                        absl::StrCat("revision ", slot.revision, ": ", adapter.status().message()));
  }
  return adapter;
}

}  // namespace loradb::distributed
