// Random LoRA adapters published into a store, for the serving tests and `loradb-bench serve`:
// real PEFT names and the base's module shapes, deterministic values per seed. LibTorch-free.
#ifndef LORADB_COMPUTE_SERVING_RANDOM_ADAPTER_H_
#define LORADB_COMPUTE_SERVING_RANDOM_ADAPTER_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "storage/store/store.h"

namespace loradb::serving {

struct RandomAdapterSpec {
  int64_t rank = 4;
  float alpha = 8;
  // A and B entries are normal with this standard deviation (B non-zero, so the adapter
  // changes the output).
  float stddev = 0.2f;
  uint64_t seed = 1;
};

// Publishes an f32 adapter with lora_A [rank, in] and lora_B [out, rank] on every projection
// ("*_proj") module of `base`'s module table as a new revision of `policy` (created on `base`
// when missing), moving `alias` to it when not empty. Its LoRA settings name those modules
// (q_proj, ...) as target_modules, so a PEFT export loads onto the base with every tensor. Errors:
// the store's (NotFound base, ...).
[[nodiscard]] absl::StatusOr<RevisionRecord> PublishRandomAdapter(Store& store,
                                                                  const std::string& base,
                                                                  const std::string& policy,
                                                                  const std::string& alias,
                                                                  const RandomAdapterSpec& spec);

}  // namespace loradb::serving

#endif  // LORADB_COMPUTE_SERVING_RANDOM_ADAPTER_H_
