#include "storage/tiers/host_buffer.h"

#include <sys/mman.h>

#include <cstdlib>
#include <string>

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

namespace {

// Buffers from this size up are mapped directly and populated up front (MADV_POPULATE_WRITE):
// a cold burst otherwise spends much of its time in one page fault per 4 KiB of adapter.
constexpr uint64_t kMapThreshold = uint64_t{4} << 20;
constexpr uint64_t kHugePage = uint64_t{2} << 20;

// LORADB_HOST_HUGEPAGES=1 adds MADV_HUGEPAGE. Off by default: in the cold-burst bench (64 x
// 63 MiB) huge pages doubled the total time and stretched p95 from 6 s to 12.6 s (direct
// compaction stalls under memory pressure), though a single load got faster.
bool HugePagesWanted() {
  static const bool wanted = [] {
    const char* v = std::getenv("LORADB_HOST_HUGEPAGES");
    return v != nullptr && std::string(v) == "1";
  }();
  return wanted;
}

}  // namespace

absl::StatusOr<std::unique_ptr<HostBuffer>> HostBuffer::Allocate(uint64_t size, bool pin) {
  uint64_t capacity = AlignUp(size == 0 ? 1 : size, kHostAlignment);
  void* p = nullptr;
  bool mapped = false;
  if (capacity >= kMapThreshold) {
    capacity = AlignUp(capacity, kHugePage);
    void* m = ::mmap(nullptr, capacity, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m != MAP_FAILED) {
      if (HugePagesWanted()) (void)::madvise(m, capacity, MADV_HUGEPAGE);
#if defined(MADV_POPULATE_WRITE)
      (void)::madvise(m, capacity, MADV_POPULATE_WRITE);
#endif
      p = m;
      mapped = true;
    }
  } else {
    p = std::aligned_alloc(kHostAlignment, capacity);
  }
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
      new HostBuffer(static_cast<std::byte*>(p), size, capacity, pinned, mapped));
}

HostBuffer::~HostBuffer() {
#if defined(LORADB_HAVE_CUDA)
  if (pinned_) (void)cudaHostUnregister(data_);
#endif
  if (mapped_) {
    ::munmap(data_, capacity_);
  } else {
    std::free(data_);
  }
}

}  // namespace loradb::tiers
