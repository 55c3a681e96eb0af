// How the device tier talks to device memory: a backend allocates one arena and copies host
// bytes into it. Two implementations: host memory (the default without a GPU, and what the
// tests use) and the CUDA runtime (cudaMalloc arena, cudaMemcpyAsync from pinned host memory on
// a stream, an event for completion). No CUDA header leaks out of this interface.
#ifndef LORADB_STORAGE_TIERS_DEVICE_BACKEND_H_
#define LORADB_STORAGE_TIERS_DEVICE_BACKEND_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace loradb::tiers {

// One host -> device copy.
struct CopyOp {
  std::byte* dst = nullptr;        // device address inside the arena
  const std::byte* src = nullptr;  // host address
  uint64_t bytes = 0;
};

class DeviceBackend {
 public:
  virtual ~DeviceBackend() = default;
  // "host" or "cuda:N".
  virtual const char* name() const = 0;
  // True when pointers into the arena are device pointers (not host-dereferenceable).
  virtual bool is_device() const = 0;
  // Allocates the arena (once). ResourceExhausted when the memory is not there.
  [[nodiscard]] virtual absl::StatusOr<std::byte*> AllocateArena(uint64_t bytes) = 0;
  virtual void FreeArena(std::byte* base) = 0;
  // Performs `ops` and returns when all of them have completed (CUDA: enqueued on a stream
  // taken from a pool, then an event is recorded and waited for). Thread-safe.
  [[nodiscard]] virtual absl::Status Copy(std::span<const CopyOp> ops) = 0;
  // Copies device bytes back to the host (tests and verification). Thread-safe.
  [[nodiscard]] virtual absl::Status CopyToHost(std::byte* dst, const std::byte* src,
                                                uint64_t bytes) = 0;
};

// Host-memory backend: the arena is page-aligned host memory, copies are memcpy.
std::unique_ptr<DeviceBackend> MakeHostBackend();

// CUDA runtime backend on device `device`. Unavailable when built without CUDA or when no
// device is present (never crashes on a machine without a GPU).
[[nodiscard]] absl::StatusOr<std::unique_ptr<DeviceBackend>> MakeCudaBackend(int device = 0);

}  // namespace loradb::tiers

#endif  // LORADB_STORAGE_TIERS_DEVICE_BACKEND_H_
