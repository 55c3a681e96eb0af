#include "compute/distributed/tp_model.h"

#include <map>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "compute/model/checkpoint.h"
#include "storage/util/status_macros.h"

namespace loradb::distributed {
namespace {

absl::StatusOr<at::ScalarType> ScalarTypeOf(DType d, const std::string& name) {
  switch (d) {
    case DType::kF32:
      return at::kFloat;
    case DType::kBF16:
      return at::kBFloat16;
    case DType::kF16:
      return at::kHalf;
    default:
      return absl::InvalidArgumentError(absl::StrCat("adapter tensor ", name, " has dtype ",
                                                     DTypeName(d), "; LoRA needs floats"));
  }
}

}  // namespace

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

absl::StatusOr<std::unique_ptr<TpAdapter>> BuildTpAdapter(const model::Qwen3Model& local_model,
                                                          TensorSet shard,
                                                          const peft::LoraConfig& config) {
  struct Pair {
    std::string key;
    at::Tensor a, b;
  };
  std::map<std::string, Pair> modules;
  for (const TensorView& t : shard.tensors()) {
    LORADB_ASSIGN_OR_RETURN(peft::PeftTensorName name, peft::ParsePeftTensorName(t.name));
    if (name.embedding) {
      return absl::UnimplementedError(absl::StrCat("LoRA on embeddings (", t.name, ")"));
    }
    LORADB_ASSIGN_OR_RETURN(at::ScalarType st, ScalarTypeOf(t.dtype, t.name));
    // A view over the shard's buffer (never written through); the TpAdapter keeps it alive.
    at::Tensor view = at::from_blob(const_cast<std::byte*>(t.data), t.shape, at::TensorOptions(st));
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
  LORADB_ASSIGN_OR_RETURN(model::LoraAdapter adapter,
                          model::LoraAdapter::Create(local_model.config(), std::move(inputs),
                                                     local_model.dtype(), local_model.device()));
  return std::make_unique<TpAdapter>(TpAdapter{std::move(shard), std::move(adapter)});
}

}  // namespace loradb::distributed
