// A cache of freed large CPU blocks for LibTorch's tensors.
//
// LibTorch allocates every CPU tensor with malloc; glibc serves large blocks (above its mmap
// threshold, at most 32 MiB) with a fresh mmap, so a training step's logits, activations and
// their gradients are new pages every step: the kernel faults them in and zeroes them, and the
// free unmaps them again. The cache keeps freed blocks of at least kCpuBlockCacheMinBytes and
// hands them to the next allocation of the same size (rounded up to 64 KiB; a step asks for the
// sizes the step before it freed), holding at most a limit of bytes; the least recently freed
// blocks leave first when it is full. Smaller blocks go to LibTorch's allocator as before. The
// memory it holds is memory the process keeps (up to the limit) after a step's tensors die;
// TrimCpuBlockCache gives it back. Reused blocks are not zeroed again: LibTorch's `empty` makes
// no promise about their contents, and every operation that needs zeros writes them itself.
#pragma once

#include <cstdint>

namespace loradb::model {

// Blocks below this size are not cached.
inline constexpr uint64_t kCpuBlockCacheMinBytes = uint64_t{1} << 20;
// The limit the trainer's entry points ask for: 4 GiB, or an eighth of the machine's memory
// where that is less.
uint64_t DefaultCpuBlockCacheBytes();

struct CpuBlockCacheStats {
  bool installed = false;     // LibTorch's CPU allocator is the cache
  uint64_t limit_bytes = 0;   // freed bytes the cache holds at most
  uint64_t cached_bytes = 0;  // freed bytes it holds now
  uint64_t hits = 0;          // allocations served from a cached block
  uint64_t misses = 0;        // allocations of a cacheable size that went to the system
};

// Makes LibTorch's CPU allocator the block cache (once per process: LibTorch has one CPU
// allocator) and sets the most freed bytes it holds to the largest `limit_bytes` any call asked
// for. A limit of 0 installs nothing, nor does any limit while the environment variable
// LORADB_NO_CPU_BLOCK_CACHE is set (to anything but "" or "0"). Returns whether LibTorch's CPU
// allocator is the cache: false also when another allocator of higher priority kept its place,
// or when the allocator in place cannot free a block by its pointer alone (the cache hands out
// plain pointers, as LibTorch's raw_allocate / raw_deallocate need, and frees through it).
bool EnableCpuBlockCache(uint64_t limit_bytes);

// Frees every cached block (blocks in use are untouched).
void TrimCpuBlockCache();

CpuBlockCacheStats GetCpuBlockCacheStats();

// Sets the limit to exactly `limit_bytes` (EnableCpuBlockCache only raises it); for tests.
void SetCpuBlockCacheLimitForTesting(uint64_t limit_bytes);

}  // namespace loradb::model
