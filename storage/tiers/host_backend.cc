#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "storage/tiers/device_backend.h"
#include "storage/tiers/host_buffer.h"

namespace loradb::tiers {
namespace {

constexpr uint64_t kMaxCopyThreads = 4;
constexpr uint64_t kBytesPerCopyThread = uint64_t{32} << 20;

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
  // Large copies (a batch of adapters is hundreds of MB) are split into byte ranges over a few
  // threads, as a device copy engine would not serialise them behind one CPU core.
  absl::Status Copy(std::span<const CopyOp> ops) override {
    uint64_t total = 0;
    for (const CopyOp& op : ops) total += op.bytes;
    const unsigned workers = static_cast<unsigned>(
        std::min<uint64_t>({kMaxCopyThreads, std::max(1u, std::thread::hardware_concurrency()),
                            total / kBytesPerCopyThread}));
    if (workers <= 1) {
      for (const CopyOp& op : ops) std::memcpy(op.dst, op.src, op.bytes);
      return absl::OkStatus();
    }
    // Worker w copies bytes [w * share, (w + 1) * share) of the ops laid end to end.
    const uint64_t share = (total + workers - 1) / workers;
    auto run = [&ops, share](unsigned w) {
      const uint64_t begin = w * share, end = begin + share;
      uint64_t at = 0;
      for (const CopyOp& op : ops) {
        const uint64_t lo = std::max(at, begin), hi = std::min(at + op.bytes, end);
        if (lo < hi) std::memcpy(op.dst + (lo - at), op.src + (lo - at), hi - lo);
        at += op.bytes;
        if (at >= end) break;
      }
    };
    std::vector<std::thread> threads;
    for (unsigned w = 1; w < workers; ++w) threads.emplace_back(run, w);
    run(0);
    for (auto& t : threads) t.join();
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
