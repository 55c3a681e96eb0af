#include <cstdlib>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "storage/tiers/device_backend.h"
#include "storage/tiers/host_buffer.h"

namespace loradb::tiers {
namespace {

class HostBackend final : public DeviceBackend {
 public:
  const char* name() const override { return "host"; }
  bool is_device() const override { return false; }
  absl::StatusOr<std::byte*> AllocateArena(uint64_t bytes) override {
    void* p = std::aligned_alloc(kHostAlignment, AlignUp(bytes == 0 ? 1 : bytes, kHostAlignment));
    if (p == nullptr) {
      return absl::ResourceExhaustedError(
          absl::StrCat("host backend: cannot allocate an arena of ", bytes, " bytes"));
    }
    // Touch every page now, as a device allocation is backed at once: the arena is made once
    // and copies into it should not pay first-touch page faults.
    std::memset(p, 0, AlignUp(bytes == 0 ? 1 : bytes, kHostAlignment));
    return static_cast<std::byte*>(p);
  }
  void FreeArena(std::byte* base) override { std::free(base); }
  absl::Status Copy(std::span<const CopyOp> ops) override {
    for (const CopyOp& op : ops) std::memcpy(op.dst, op.src, op.bytes);
    return absl::OkStatus();
  }
  absl::Status CopyToHost(std::byte* dst, const std::byte* src, uint64_t bytes) override {
    std::memcpy(dst, src, bytes);
    return absl::OkStatus();
  }
};

}  // namespace

std::unique_ptr<DeviceBackend> MakeHostBackend() { return std::make_unique<HostBackend>(); }

}  // namespace loradb::tiers
