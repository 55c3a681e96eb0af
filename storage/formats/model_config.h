// Hugging Face `config.json` for the Qwen3 family (dense `qwen3` and MoE `qwen3_moe`): the
// architecture, and the table of LoRA-targetable modules it implies (name -> in/out features).
// Module names drop the HF prefix: `layers.3.self_attn.q_proj`, `layers.3.mlp.experts.7.up_proj`,
// `embed_tokens`, `lm_head`.
//
// The reader accepts the layouts transformers 4 and 5 write (docs/model.md lists every key). A
// key that changes the computation is either read into ModelConfig (and applied by
// compute/model) or the config is refused with an error naming the key and its value; a missing
// key takes the default transformers gives it for that model_type, never another.
#ifndef LORADB_STORAGE_FORMATS_MODEL_CONFIG_H_
#define LORADB_STORAGE_FORMATS_MODEL_CONFIG_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
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

// Upper bounds on every size a base declares, checked before anything is sized by it (a
// module table built, a model or KV cache allocated, a loop run). Each is far above every
// published model (the largest in parentheses), so only hostile or broken input reaches them.
// docs/model.md and docs/http-api.md state the same numbers.
struct ModelLimits {
  static constexpr int64_t kLayers = 1024;               // (126, Llama 3.1 405B)
  static constexpr int64_t kHiddenSize = 131072;         // (16384)
  static constexpr int64_t kHeads = 1024;                // attention heads (128)
  static constexpr int64_t kHeadDim = 2048;              // (256)
  static constexpr int64_t kIntermediateSize = 1 << 20;  // dense or per-expert MLP width (53248)
  static constexpr int64_t kVocabSize = 1 << 24;         // (262144)
  static constexpr int64_t kExperts = 4096;              // (384)
  static constexpr int64_t kPositions = 1 << 24;         // max_position_embeddings (10485760)
  // K/V elements one token adds to a KV cache: layers x kv_heads x head_dim (129024).
  static constexpr int64_t kKvElementsPerToken = 1 << 24;
  // Module tables (derived from a config or given explicitly).
  static constexpr int64_t kModules = 1 << 20;           // entries (Qwen3-235B-A22B: 36568)
  static constexpr int64_t kModuleFeatures = 1 << 24;    // a module's in or out (262144)
  static constexpr int64_t kModuleElements = 1LL << 36;  // in x out of one module (2.1e9)
  static constexpr int64_t kModelElements = 1LL << 43;   // sum of in x out over modules (1.0e12)
  static constexpr int64_t kModuleNameBytes = 1024;
};

// The member initialisers serve configs built in code; ParseModelConfigJson sets every member
// from the file or from transformers' default for the model_type.
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
  double rope_theta = 1e6;  // default RoPE (the only rope_type loradb computes)
  bool tie_word_embeddings = false;
  bool attention_bias = false;  // biases on q/k/v/o_proj
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
  // InvalidArgument naming the field when a size is not positive or above ModelLimits, heads do
  // not divide, head_dim is odd, or an MoE count is out of range. ParseModelConfigJson returns
  // only configs that pass; call it on configs built in code before sizing anything by them.
  [[nodiscard]] absl::Status Validate() const;
  // Every LoRA-targetable module, layer by layer: q/k/v/o, the MLP (gate/up/down, or per-expert
  // gate/up/down plus the router `mlp.gate`), then `embed_tokens` and `lm_head`. The config must
  // have passed Validate (the table's size is bounded by ModelLimits::kModules).
  std::vector<ModuleShape> LoraModules() const;
  // A config.json (HF field names, the transformers 4 layout, which transformers 5 also reads)
  // that ParseModelConfigJson reads back to an equal config.
  std::string ToJson() const;
};

// Parses a config.json in the transformers 4 or 5 layout. InvalidArgument (each error names
// the key and, where there is one, its value) for malformed or too deeply nested JSON, a
// model_type outside the Qwen3 family, missing or out-of-range sizes (ModelLimits), and every
// setting loradb's Qwen3 does not compute: a rope_type other than "default", sliding-window
// attention, hidden_act other than "silu", partial rotary embeddings, attention dropout, router
// auxiliary loss, quantized weights.
[[nodiscard]] absl::StatusOr<ModelConfig> ParseModelConfigJson(absl::string_view json);
// Reads `path` (a config.json file, or a directory holding one).
[[nodiscard]] absl::StatusOr<ModelConfig> ReadModelConfig(const std::string& path);

// InvalidArgument when an explicit module table is outside ModelLimits: more than kModules
// entries, an empty or over-long name, in/out outside [1, kModuleFeatures], a module or the
// whole table above kModuleElements / kModelElements. Store::AddBase checks every base with it.
[[nodiscard]] absl::Status CheckModuleTable(const std::vector<ModuleShape>& modules);

}  // namespace loradb

#endif  // LORADB_STORAGE_FORMATS_MODEL_CONFIG_H_
