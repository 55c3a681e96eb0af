// Hugging Face `config.json` for the Qwen3 family (dense `qwen3` and MoE `qwen3_moe`): the
// architecture, and the table of LoRA-targetable modules it implies (name -> in/out features).
// Module names drop the HF prefix: `layers.3.self_attn.q_proj`, `layers.3.mlp.experts.7.up_proj`,
// `embed_tokens`, `lm_head`.
#ifndef LORADB_STORAGE_FORMATS_MODEL_CONFIG_H_
#define LORADB_STORAGE_FORMATS_MODEL_CONFIG_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace loradb {

// One LoRA-targetable linear (or embedding) module of a base: y = W x with W of shape [out, in].
struct ModuleShape {
  std::string name;
  int64_t in = 0;
  int64_t out = 0;
  bool operator==(const ModuleShape&) const = default;
};

struct ModelConfig {
  std::string model_type;  // "qwen3" or "qwen3_moe"
  int64_t vocab_size = 0;
  int64_t hidden_size = 0;
  int64_t intermediate_size = 0;  // dense MLP width
  int64_t num_hidden_layers = 0;
  int64_t num_attention_heads = 0;
  int64_t num_key_value_heads = 0;
  int64_t head_dim = 0;
  int64_t max_position_embeddings = 0;
  double rms_norm_eps = 1e-6;
  double rope_theta = 1e6;
  bool tie_word_embeddings = false;
  bool attention_bias = false;
  std::string torch_dtype = "bfloat16";
  // MoE (qwen3_moe); num_experts == 0 for dense models.
  int64_t num_experts = 0;
  int64_t num_experts_per_tok = 0;
  int64_t moe_intermediate_size = 0;
  int64_t decoder_sparse_step = 1;
  bool norm_topk_prob = true;
  std::vector<int64_t> mlp_only_layers;

  bool is_moe() const { return num_experts > 0; }
  // True when layer `layer`'s MLP is a sparse expert block (Qwen3-MoE's rule).
  bool IsMoeLayer(int64_t layer) const;
  // Every LoRA-targetable module, layer by layer: q/k/v/o, the MLP (gate/up/down, or per-expert
  // gate/up/down plus the router `mlp.gate`), then `embed_tokens` and `lm_head`.
  std::vector<ModuleShape> LoraModules() const;
  // A config.json (HF field names) that ParseModelConfigJson reads back to an equal config.
  std::string ToJson() const;
};

// Parses a config.json. InvalidArgument for malformed JSON, a model_type outside the Qwen3
// family, or missing/non-positive sizes (each error names the field).
[[nodiscard]] absl::StatusOr<ModelConfig> ParseModelConfigJson(absl::string_view json);
// Reads `path` (a config.json file, or a directory holding one).
[[nodiscard]] absl::StatusOr<ModelConfig> ReadModelConfig(const std::string& path);

}  // namespace loradb

#endif  // LORADB_STORAGE_FORMATS_MODEL_CONFIG_H_
