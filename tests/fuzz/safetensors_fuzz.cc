// libFuzzer target for the safetensors reader (tools/dev fuzz safetensors SECONDS).
// Whatever the bytes, Parse must return a status without crashing; when it accepts them, the
// writer's output must parse back to the same tensors and metadata.
#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "storage/formats/safetensors.h"

namespace {

std::span<const std::byte> AsBytes(const uint8_t* data, size_t size) {
  return {reinterpret_cast<const std::byte*>(data), size};
}

void Check(bool ok) {
  if (!ok) std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace loradb;  // NOLINT(build/namespaces): fuzz target
  auto set = safetensors::Parse(AsBytes(data, size), nullptr);
  if (!set.ok()) return 0;
  uint64_t covered = 0;
  for (const TensorView& t : set->tensors()) {
    Check(t.data >= reinterpret_cast<const std::byte*>(data));
    Check(t.data + t.nbytes <= reinterpret_cast<const std::byte*>(data) + size);
    covered += t.nbytes;
  }
  auto bytes = safetensors::Serialize(set->tensors(), set->metadata());
  Check(bytes.ok());
  auto holder = std::make_shared<std::string>(std::move(*bytes));
  auto again = safetensors::Parse(
      {reinterpret_cast<const std::byte*>(holder->data()), holder->size()}, holder);
  Check(again.ok());
  Check(again->size() == set->size());
  Check(again->metadata() == set->metadata());
  for (const TensorView& t : set->tensors()) {
    const TensorView* u = again->Find(t.name);
    Check(u != nullptr && u->dtype == t.dtype && u->shape == t.shape && u->nbytes == t.nbytes);
    Check(t.nbytes == 0 || std::memcmp(u->data, t.data, t.nbytes) == 0);
  }
  Check(again->total_bytes() == covered);
  return 0;
}
