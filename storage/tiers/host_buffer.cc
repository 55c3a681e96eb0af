#include "storage/tiers/host_buffer.h"

#include <cstdlib>

#include "absl/strings/str_cat.h"

#if defined(LORADB_HAVE_CUDA)
#include <cuda_runtime_api.h>
#endif

namespace loradb::tiers {

bool CudaDeviceAvailable() {
#if defined(LORADB_HAVE_CUDA)
  static const bool available = [] {
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess) {
      (void)cudaGetLastError();  // clear the sticky "no device" error
      return false;
    }
    return count > 0;
  }();
  return available;
#else
  return false;
#endif
}

absl::StatusOr<std::unique_ptr<HostBuffer>> HostBuffer::Allocate(uint64_t size, bool pin) {
  uint64_t capacity = AlignUp(size == 0 ? 1 : size, kHostAlignment);
  void* p = std::aligned_alloc(kHostAlignment, capacity);
  if (p == nullptr) {
    return absl::ResourceExhaustedError(
        absl::StrCat("cannot allocate a host buffer of ", capacity, " bytes"));
  }
  bool pinned = false;
#if defined(LORADB_HAVE_CUDA)
  if (pin && CudaDeviceAvailable()) {
    pinned = cudaHostRegister(p, capacity, cudaHostRegisterDefault) == cudaSuccess;
    if (!pinned) (void)cudaGetLastError();
  }
#else
  (void)pin;
#endif
  return std::unique_ptr<HostBuffer>(
      new HostBuffer(static_cast<std::byte*>(p), size, capacity, pinned));
}

HostBuffer::~HostBuffer() {
#if defined(LORADB_HAVE_CUDA)
  if (pinned_) (void)cudaHostUnregister(data_);
#endif
  std::free(data_);
}

}  // namespace loradb::tiers
