#include "compute/model/checkpoint.h"

#include <ATen/CPUGeneratorImpl.h>

#include <cmath>
#include <filesystem>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "storage/formats/safetensors.h"
#include "storage/util/file_util.h"
#include "storage/util/status_macros.h"

namespace loradb::model {

absl::StatusOr<TensorSet> ReadCheckpointTensors(const std::string& dir) {
  namespace fs = std::filesystem;
  const fs::path index = fs::path(dir) / "model.safetensors.index.json";
  const fs::path single = fs::path(dir) / "model.safetensors";
  std::error_code ec;
  if (fs::exists(index, ec)) return safetensors::ReadSharded(index.string());
  if (fs::exists(single, ec)) return safetensors::ReadFile(single.string());
  return absl::NotFoundError(
      absl::StrCat(dir, ": no model.safetensors or model.safetensors.index.json"));
}

namespace {

absl::StatusOr<DType> StorageDType(at::ScalarType t) {
  switch (t) {
    case at::kFloat:
      return DType::kF32;
    case at::kBFloat16:
      return DType::kBF16;
    case at::kHalf:
      return DType::kF16;
    default:
      return absl::InvalidArgumentError("checkpoint dtype must be f32, bf16 or f16");
  }
}

const char* HfDTypeName(at::ScalarType t) {
  return t == at::kFloat ? "float32" : t == at::kBFloat16 ? "bfloat16" : "float16";
}

}  // namespace

double DefaultLmHeadStd(const ModelConfig& config) {
  return 1.0 / std::sqrt(static_cast<double>(config.hidden_size));
}

absl::Status WriteRandomCheckpoint(const ModelConfig& config, const std::string& dir, uint64_t seed,
                                   at::ScalarType dtype, double std, double lm_head_std) {
  LORADB_ASSIGN_OR_RETURN(DType st, StorageDType(dtype));
  if (!(std > 0) || !(lm_head_std >= 0) || !std::isfinite(std) || !std::isfinite(lm_head_std)) {
    return absl::InvalidArgumentError(
        absl::StrCat("random checkpoint: bad init std ", std, " / lm_head std ", lm_head_std));
  }
  const ModelConfig& c = config;
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  std::vector<std::pair<std::string, at::Tensor>> tensors;
  auto normal = [&](const std::string& name, std::vector<int64_t> shape, double sd = 0) {
    at::Tensor t = at::empty(shape, at::kFloat);
    t.normal_(0.0, sd > 0 ? sd : std, gen);
    tensors.emplace_back(name, t.to(dtype).contiguous());
  };
  auto norm = [&](const std::string& name, int64_t n) {
    at::Tensor t = at::empty({n}, at::kFloat);
    t.normal_(1.0, 0.1, gen);
    tensors.emplace_back(name, t.to(dtype).contiguous());
  };
  const int64_t h = c.hidden_size, hd = c.head_dim;
  const int64_t q = c.num_attention_heads * hd, kv = c.num_key_value_heads * hd;
  normal("model.embed_tokens.weight", {c.vocab_size, h});
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    const std::string p = absl::StrCat("model.layers.", i, ".");
    norm(p + "input_layernorm.weight", h);
    norm(p + "post_attention_layernorm.weight", h);
    normal(p + "self_attn.q_proj.weight", {q, h});
    normal(p + "self_attn.k_proj.weight", {kv, h});
    normal(p + "self_attn.v_proj.weight", {kv, h});
    normal(p + "self_attn.o_proj.weight", {h, q});
    if (c.attention_bias) {
      normal(p + "self_attn.q_proj.bias", {q});
      normal(p + "self_attn.k_proj.bias", {kv});
      normal(p + "self_attn.v_proj.bias", {kv});
      normal(p + "self_attn.o_proj.bias", {h});
    }
    norm(p + "self_attn.q_norm.weight", hd);
    norm(p + "self_attn.k_norm.weight", hd);
    if (c.IsMoeLayer(i)) {
      const int64_t mi = c.moe_intermediate_size;
      normal(p + "mlp.gate.weight", {c.num_experts, h});
      for (int64_t e = 0; e < c.num_experts; ++e) {
        const std::string ep = absl::StrCat(p, "mlp.experts.", e, ".");
        normal(ep + "gate_proj.weight", {mi, h});
        normal(ep + "up_proj.weight", {mi, h});
        normal(ep + "down_proj.weight", {h, mi});
      }
    } else {
      normal(p + "mlp.gate_proj.weight", {c.intermediate_size, h});
      normal(p + "mlp.up_proj.weight", {c.intermediate_size, h});
      normal(p + "mlp.down_proj.weight", {h, c.intermediate_size});
    }
  }
  norm("model.norm.weight", h);
  if (!c.tie_word_embeddings) normal("lm_head.weight", {c.vocab_size, h}, lm_head_std);

  std::vector<TensorView> views;
  views.reserve(tensors.size());
  for (const auto& [name, t] : tensors) {
    TensorView v;
    v.name = name;
    v.dtype = st;
    v.shape = t.sizes().vec();
    v.data = static_cast<const std::byte*>(t.data_ptr());
    v.nbytes = t.nbytes();
    views.push_back(std::move(v));
  }
  LORADB_RETURN_IF_ERROR(CreateDirectories(dir));
  ModelConfig out = config;
  out.torch_dtype = HfDTypeName(dtype);
  LORADB_RETURN_IF_ERROR(safetensors::WriteFile(
      (std::filesystem::path(dir) / "model.safetensors").string(), views, {{"format", "pt"}}));
  return WriteFileAtomic((std::filesystem::path(dir) / "config.json").string(), out.ToJson());
}

}  // namespace loradb::model
