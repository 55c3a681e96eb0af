// The CPU block cache (compute/model/cpu_block_cache.h) under LibTorch's tensors: freed blocks of
// a cached size come back to the next tensor of that size, small tensors bypass it, the least
// recently freed blocks leave first past the limit, and a reused block holds what its new
// tensor's operation writes.
#include "compute/model/cpu_block_cache.h"

#include <ATen/ATen.h>
#include <c10/core/CPUAllocator.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>

namespace loradb::model {
namespace {

constexpr int64_t kMiB = int64_t{1} << 20;

// A float tensor of `bytes` bytes.
at::Tensor Block(int64_t bytes) { return at::empty({bytes / 4}, at::kFloat); }

class CpuBlockCacheTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (std::getenv("LORADB_NO_CPU_BLOCK_CACHE") != nullptr) {
      GTEST_SKIP() << "LORADB_NO_CPU_BLOCK_CACHE is set";
    }
    ASSERT_TRUE(EnableCpuBlockCache(DefaultCpuBlockCacheBytes()));
    SetCpuBlockCacheLimitForTesting(DefaultCpuBlockCacheBytes());
    TrimCpuBlockCache();
  }
  void TearDown() override {
    SetCpuBlockCacheLimitForTesting(DefaultCpuBlockCacheBytes());
    TrimCpuBlockCache();
  }
};

TEST_F(CpuBlockCacheTest, FreedBlockServesTheNextTensorOfItsSize) {
  const CpuBlockCacheStats before = GetCpuBlockCacheStats();
  EXPECT_TRUE(before.installed);
  at::Tensor a = Block(4 * kMiB);
  const void* first = a.data_ptr();
  a.reset();
  EXPECT_EQ(GetCpuBlockCacheStats().cached_bytes, uint64_t{4} * kMiB);
  at::Tensor b = Block(4 * kMiB);
  EXPECT_EQ(b.data_ptr(), first);
  const CpuBlockCacheStats after = GetCpuBlockCacheStats();
  EXPECT_EQ(after.hits, before.hits + 1);
  EXPECT_EQ(after.misses, before.misses + 1);
  EXPECT_EQ(after.cached_bytes, 0u);
  // Another size does not take it.
  b.reset();
  at::Tensor c = Block(8 * kMiB);
  EXPECT_NE(c.data_ptr(), first);
  EXPECT_EQ(GetCpuBlockCacheStats().cached_bytes, uint64_t{4} * kMiB);
}

TEST_F(CpuBlockCacheTest, SmallTensorsBypassIt) {
  const CpuBlockCacheStats before = GetCpuBlockCacheStats();
  for (int i = 0; i < 10; ++i) at::Tensor t = at::empty({1000}, at::kFloat);
  const CpuBlockCacheStats after = GetCpuBlockCacheStats();
  EXPECT_EQ(after.hits, before.hits);
  EXPECT_EQ(after.misses, before.misses);
  EXPECT_EQ(after.cached_bytes, 0u);
}

TEST_F(CpuBlockCacheTest, LeastRecentlyFreedLeavesFirstPastTheLimit) {
  SetCpuBlockCacheLimitForTesting(6 * kMiB);
  at::Tensor a = Block(4 * kMiB), b = Block(3 * kMiB), c = Block(2 * kMiB);
  const void* pb = b.data_ptr();
  const void* pc = c.data_ptr();
  a.reset();  // 4 MiB cached
  b.reset();  // 7 MiB would pass 6: a leaves
  c.reset();  // 5 MiB
  EXPECT_EQ(GetCpuBlockCacheStats().cached_bytes, uint64_t{5} * kMiB);
  const CpuBlockCacheStats before = GetCpuBlockCacheStats();
  at::Tensor a2 = Block(4 * kMiB), b2 = Block(3 * kMiB), c2 = Block(2 * kMiB);
  EXPECT_EQ(b2.data_ptr(), pb);
  EXPECT_EQ(c2.data_ptr(), pc);
  const CpuBlockCacheStats after = GetCpuBlockCacheStats();
  EXPECT_EQ(after.hits, before.hits + 2);
  EXPECT_EQ(after.misses, before.misses + 1);
  // A block larger than the limit is never kept.
  at::Tensor big = Block(8 * kMiB);
  big.reset();
  EXPECT_EQ(GetCpuBlockCacheStats().cached_bytes, 0u);
}

// LibTorch's raw interface (raw_allocate / raw_deallocate, used by code that wants a plain
// pointer) works for blocks of every size, and a large one still returns to the cache.
TEST_F(CpuBlockCacheTest, RawAllocationsOfEverySizeRoundTrip) {
  c10::Allocator* alloc = c10::GetCPUAllocator();
  ASSERT_NE(alloc->raw_deleter(), nullptr);
  for (size_t bytes : {size_t{64}, size_t{100000}, size_t{3} << 20}) {
    void* p = alloc->raw_allocate(bytes);
    ASSERT_NE(p, nullptr);
    std::memset(p, 1, bytes);
    alloc->raw_deallocate(p);
  }
  EXPECT_EQ(GetCpuBlockCacheStats().cached_bytes, uint64_t{3} << 20);
  const at::DataPtr d = alloc->allocate(size_t{5} << 20);
  EXPECT_TRUE(alloc->is_simple_data_ptr(d));
}

TEST_F(CpuBlockCacheTest, TrimGivesEverythingBack) {
  at::Tensor a = Block(2 * kMiB), b = Block(3 * kMiB);
  a.reset();
  b.reset();
  EXPECT_EQ(GetCpuBlockCacheStats().cached_bytes, uint64_t{5} * kMiB);
  TrimCpuBlockCache();
  EXPECT_EQ(GetCpuBlockCacheStats().cached_bytes, 0u);
}

TEST_F(CpuBlockCacheTest, ReusedBlockHoldsWhatItsOperationWrites) {
  at::Tensor a = at::full({kMiB}, 7.0f, at::kFloat);
  a.reset();
  CpuBlockCacheStats before = GetCpuBlockCacheStats();
  at::Tensor z = at::zeros({kMiB}, at::kFloat);
  EXPECT_EQ(GetCpuBlockCacheStats().hits, before.hits + 1);
  EXPECT_EQ(at::count_nonzero(z).item<int64_t>(), 0);
  z.fill_(7.0f);
  z.reset();
  before = GetCpuBlockCacheStats();
  at::Tensor x = at::arange(kMiB, at::kFloat);
  EXPECT_EQ(GetCpuBlockCacheStats().hits, before.hits + 1);
  EXPECT_TRUE(at::equal(x, at::arange(kMiB, at::kDouble).to(at::kFloat)));
}

}  // namespace
}  // namespace loradb::model
