// Synthetic LoRA adapters for benchmarks and tests: deterministic pseudo-random values, real
// PEFT names and shapes. The default spec is a Qwen3-30B-A3B-shaped rank-1 bf16 MoE adapter
// (48 layers x 128 experts x gate/up/down x A/B, plus q/k/v/o A/B: 37,248 tensors).
#ifndef LORADB_STORAGE_FORMATS_SYNTHETIC_H_
#define LORADB_STORAGE_FORMATS_SYNTHETIC_H_

#include <cstdint>

#include "absl/status/statusor.h"
#include "storage/formats/tensor.h"

namespace loradb {

struct SyntheticMoeSpec {
  int layers = 48;
  int experts = 128;  // 0: no expert tensors
  int rank = 1;
  int64_t hidden = 2048;
  int64_t moe_intermediate = 768;
  int64_t q_heads = 32;
  int64_t kv_heads = 4;
  int64_t head_dim = 128;
  DType dtype = DType::kBF16;  // a floating type: BF16, F16 or F32
  uint64_t seed = 1;

  // 2 * layers * (4 + 3 * experts).
  uint64_t tensor_count() const;
};

// Builds the adapter in one heap buffer owned by the returned set (the set's backing). Names
// follow PEFT: "base_model.model.model.layers.{L}.self_attn.{q|k|v|o}_proj.lora_{A|B}.weight"
// and "base_model.model.model.layers.{L}.mlp.experts.{E}.{gate|up|down}_proj.lora_{A|B}.weight";
// A is [rank, in], B is [out, rank]. Values are small (|v| < 0.05), different per seed.
// InvalidArgument for non-positive sizes or a non-float dtype.
[[nodiscard]] absl::StatusOr<TensorSet> MakeSyntheticMoeAdapter(const SyntheticMoeSpec& spec);

// A base module table with one module, "layers.0.self_attn.q_proj" (in 16, out 32): the base
// MakeTinyQProjAdapter's tensors fit (Store::AddBaseFromModuleTable).
inline constexpr char kTinyQProjModuleTable[] =
    R"({"modules":[{"name":"layers.0.self_attn.q_proj","in":16,"out":32}]})";

// The smallest adapter the store tests and the replication bench publish: rank 4, F32,
// "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight" [4, 16] with element
// i = seed + 0.5 i and "...lora_B.weight" [32, 4] with element i = seed - 0.25 i (as floats), so
// distinct seeds give distinct bytes. The set owns its buffer.
TensorSet MakeTinyQProjAdapter(uint64_t seed);

}  // namespace loradb

#endif  // LORADB_STORAGE_FORMATS_SYNTHETIC_H_
