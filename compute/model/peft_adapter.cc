#include "compute/model/peft_adapter.h"

#include <cstring>
#include <map>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "storage/util/status_macros.h"

namespace loradb::model {
namespace {

absl::StatusOr<at::Tensor> CopyView(const TensorView& v) {
  at::ScalarType st;
  switch (v.dtype) {
    case DType::kF32:
      st = at::kFloat;
      break;
    case DType::kBF16:
      st = at::kBFloat16;
      break;
    case DType::kF16:
      st = at::kHalf;
      break;
    default:
      return absl::InvalidArgumentError(absl::StrCat("adapter tensor \"", v.name, "\" has dtype ",
                                                     DTypeName(v.dtype), "; need F32/BF16/F16"));
  }
  // Views may be unaligned for the dtype: copy bytewise into a fresh tensor.
  at::Tensor t = at::empty(v.shape, at::TensorOptions(st));
  std::memcpy(t.data_ptr(), v.data, v.nbytes);
  return t;
}

}  // namespace

absl::StatusOr<LoraAdapter> LoraAdapterFromPeft(const ModelConfig& config,
                                                const peft::PeftAdapter& adapter,
                                                at::ScalarType dtype) {
  struct Pair {
    const TensorView* a = nullptr;
    const TensorView* b = nullptr;
    std::string key;
  };
  std::map<std::string, Pair> modules;
  // A PEFT feature the model does not apply refuses the adapter by name (never dropped).
  LORADB_RETURN_IF_ERROR(
      peft::RefuseUnapplied(peft::PeftFeaturesUsed(adapter.config, adapter.tensors.tensors()),
                            /*applied=*/0, "the model's PEFT adapter loader"));
  for (const TensorView& v : adapter.tensors.tensors()) {
    LORADB_ASSIGN_OR_RETURN(peft::PeftTensorName n, peft::ParsePeftTensorName(v.name));
    if (n.embedding) {
      return absl::UnimplementedError(
          absl::StrCat("adapter tensor \"", v.name, "\": embedding LoRA is not supported"));
    }
    Pair& p = modules[n.module];
    p.key = n.module_key;
    (n.side == peft::LoraSide::kA ? p.a : p.b) = &v;
  }
  std::vector<LoraModuleInput> inputs;
  for (const auto& [module, p] : modules) {
    if (p.a == nullptr || p.b == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("adapter module \"", module, "\" lacks lora_A or lora_B"));
    }
    LORADB_ASSIGN_OR_RETURN(at::Tensor a, CopyView(*p.a));
    LORADB_ASSIGN_OR_RETURN(at::Tensor b, CopyView(*p.b));
    inputs.push_back({module, std::move(a), std::move(b), adapter.config.ScaleFor(p.key)});
  }
  return LoraAdapter::Create(config, std::move(inputs), dtype);
}

absl::StatusOr<LoraAdapter> LoadPeftAdapter(const ModelConfig& config, const std::string& dir,
                                            at::ScalarType dtype) {
  LORADB_ASSIGN_OR_RETURN(peft::PeftAdapter adapter, peft::ReadPeftDir(dir));
  try {
    return LoraAdapterFromPeft(config, adapter, dtype);
  } catch (const c10::Error& e) {
    return absl::InternalError(absl::StrCat("PEFT adapter: ", e.what_without_backtrace()));
  }
}

}  // namespace loradb::model
