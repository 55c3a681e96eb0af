// Shared by the storage tests that publish adapters: a store opened with a base and a policy on
// it, and an adapter builder that owns float buffers and hands out PEFT-named TensorViews over
// them, for publishing through Store::PublishTensors.
#ifndef LORADB_TESTS_STORAGE_ADAPTER_TEST_UTIL_H_
#define LORADB_TESTS_STORAGE_ADAPTER_TEST_UTIL_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "storage/formats/tensor.h"
#include "storage/store/store.h"

namespace loradb::testing {

// Opens (creating) the store at `dir` with `options`, adds base `base` from `module_table` (see
// Store::AddBaseFromModuleTable) and creates `policy` on it. The first error, if any.
inline absl::StatusOr<std::unique_ptr<Store>> OpenStoreWithPolicy(
    const std::string& dir, const std::string& base, const std::string& module_table,
    const std::string& policy, const StoreOptions& options = {}) {
  absl::StatusOr<std::unique_ptr<Store>> store = Store::Open(dir, options);
  if (!store.ok()) return store.status();
  if (auto b = (*store)->AddBaseFromModuleTable(base, module_table); !b.ok()) return b.status();
  if (auto p = (*store)->CreatePolicy(policy, base); !p.ok()) return p.status();
  return store;
}

// Owns float buffers and hands out PEFT-named views over them; the views stay valid while the
// Adapter lives (moving it keeps them: the buffers are heap-allocated).
struct Adapter {
  std::vector<std::unique_ptr<std::vector<float>>> bufs;
  std::vector<TensorView> views;

  // Adds `base_model.model.model.<module>.lora_{A,B}.weight` (B when `b`), F32 of shape
  // [d0, d1], element i = seed + 0.5 * i.
  void Add(const std::string& module, bool b, int64_t d0, int64_t d1, float seed) {
    auto buf = std::make_unique<std::vector<float>>(static_cast<size_t>(d0 * d1));
    for (size_t i = 0; i < buf->size(); ++i) (*buf)[i] = seed + static_cast<float>(i) * 0.5f;
    TensorView v;
    v.name =
        absl::StrCat("base_model.model.model.", module, b ? ".lora_B.weight" : ".lora_A.weight");
    v.dtype = DType::kF32;
    v.shape = {d0, d1};
    v.data = reinterpret_cast<const std::byte*>(buf->data());
    v.nbytes = buf->size() * sizeof(float);
    views.push_back(v);
    bufs.push_back(std::move(buf));
  }
};

}  // namespace loradb::testing

#endif  // LORADB_TESTS_STORAGE_ADAPTER_TEST_UTIL_H_
