// Page-aligned host buffers for adapter bytes: what the loader reads into (O_DIRECT needs the
// alignment) and what cache entries own. When the CUDA runtime is usable the buffer is pinned
// with cudaHostRegister so device copies can run asynchronously; pinning is best effort and
// reported, never required.
#ifndef LORADB_STORAGE_TIERS_HOST_BUFFER_H_
#define LORADB_STORAGE_TIERS_HOST_BUFFER_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>

#include "absl/status/statusor.h"

namespace loradb::tiers {

// Alignment of every HostBuffer and of the sizes they are rounded to.
inline constexpr size_t kHostAlignment = 4096;

// Rounds `n` up to a multiple of `alignment` (a power of two).
inline constexpr uint64_t AlignUp(uint64_t n, uint64_t alignment) {
  return (n + alignment - 1) & ~(alignment - 1);
}

// An owned, page-aligned allocation (large ones mmap'ed and populated at allocation; huge
// pages only with LORADB_HOST_HUGEPAGES=1). Not copyable.
class HostBuffer {
 public:
  // Allocates `size` bytes (capacity rounded up to kHostAlignment). With `pin`, tries
  // cudaHostRegister when built with CUDA and a device is present; `pinned()` says whether it
  // worked. ResourceExhausted when the allocation fails.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<HostBuffer>> Allocate(uint64_t size,
                                                                            bool pin);

  HostBuffer(const HostBuffer&) = delete;
  HostBuffer& operator=(const HostBuffer&) = delete;
  ~HostBuffer();

  std::byte* data() { return data_; }
  const std::byte* data() const { return data_; }
  // Bytes of payload (what the caller asked for).
  uint64_t size() const { return size_; }
  // Bytes allocated (size rounded up to kHostAlignment, or to 2 MiB for mapped buffers).
  uint64_t capacity() const { return capacity_; }
  bool pinned() const { return pinned_; }
  std::span<const std::byte> bytes() const { return {data_, static_cast<size_t>(size_)}; }

 private:
  HostBuffer(std::byte* data, uint64_t size, uint64_t capacity, bool pinned, bool mapped)
      : data_(data), size_(size), capacity_(capacity), pinned_(pinned), mapped_(mapped) {}

  std::byte* data_;
  uint64_t size_;
  uint64_t capacity_;
  bool pinned_;
  bool mapped_;  // mmap'ed (large buffers) rather than aligned_alloc'ed
};

// True when the CUDA runtime is compiled in and reports at least one device. Cached after the
// first call; never fails (no GPU -> false).
bool CudaDeviceAvailable();

}  // namespace loradb::tiers

#endif  // LORADB_STORAGE_TIERS_HOST_BUFFER_H_
