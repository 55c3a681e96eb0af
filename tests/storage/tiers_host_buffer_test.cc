#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <thread>
#include <vector>

#include "storage/tiers/device_backend.h"
#include "storage/tiers/host_buffer.h"
#include "tests/storage/host_buffer_pool_test_util.h"

namespace loradb::tiers {
namespace {

constexpr uint64_t kMiB = uint64_t{1} << 20;

using ::loradb::testing::HostBufferPoolScope;

TEST(HostBufferPoolTest, LargeBuffersAreReusedForOverwrite) {
  HostBufferPoolScope scope(64 * kMiB);
  auto a = HostBuffer::AllocateForOverwrite(8 * kMiB, false);
  ASSERT_TRUE(a.ok()) << a.status();
  std::byte* first = (*a)->data();
  std::memset(first, 0x5a, 8 * kMiB);
  const HostBufferPoolStats before = GetHostBufferPoolStats();
  a->reset();
  EXPECT_EQ(GetHostBufferPoolStats().buffers, 1u);
  EXPECT_GE(GetHostBufferPoolStats().bytes, 8 * kMiB);

  // Allocate never takes from the pool: a fresh mapping, the pooled one stays.
  auto fresh = HostBuffer::Allocate(8 * kMiB, false);
  ASSERT_TRUE(fresh.ok());
  EXPECT_NE((*fresh)->data(), first);
  EXPECT_EQ(GetHostBufferPoolStats().buffers, 1u);

  // A slightly smaller need reuses it; its size is the new need, its bytes are left as they were.
  auto b = HostBuffer::AllocateForOverwrite(8 * kMiB - 100, false);
  ASSERT_TRUE(b.ok());
  EXPECT_EQ((*b)->data(), first);
  EXPECT_EQ((*b)->size(), 8 * kMiB - 100);
  EXPECT_GE((*b)->capacity(), 8 * kMiB);
  EXPECT_EQ(GetHostBufferPoolStats().reused, before.reused + 1);
  EXPECT_EQ(GetHostBufferPoolStats().buffers, 0u);  // `a`'s buffer is in use again

  // A buffer from Allocate is unmapped when freed, never parked in the pool; one from the pool
  // goes back.
  fresh->reset();
  EXPECT_EQ(GetHostBufferPoolStats().buffers, 0u);
  b->reset();
  EXPECT_EQ(GetHostBufferPoolStats().buffers, 1u);
}

TEST(HostBufferPoolTest, OnlyCloseSizesAndSmallBuffersAreNotPooled) {
  HostBufferPoolScope scope(256 * kMiB);
  auto big = HostBuffer::AllocateForOverwrite(32 * kMiB, false);
  ASSERT_TRUE(big.ok());
  std::byte* big_data = (*big)->data();
  big->reset();
  // 32 MiB is more than 1/8 above an 8 MiB need: not handed out.
  auto small_need = HostBuffer::AllocateForOverwrite(8 * kMiB, false);
  ASSERT_TRUE(small_need.ok());
  EXPECT_NE((*small_need)->data(), big_data);
  // Buffers under the mapping threshold never enter the pool.
  const uint64_t pooled = GetHostBufferPoolStats().buffers;
  {
    auto tiny = HostBuffer::AllocateForOverwrite(64 * 1024, false);
    ASSERT_TRUE(tiny.ok());
  }
  EXPECT_EQ(GetHostBufferPoolStats().buffers, pooled);
}

TEST(HostBufferPoolTest, LimitReleasesOldestAndZeroTurnsPoolingOff) {
  HostBufferPoolScope scope(20 * kMiB);
  std::vector<std::unique_ptr<HostBuffer>> bufs;
  for (int i = 0; i < 3; ++i) {
    auto b = HostBuffer::AllocateForOverwrite(8 * kMiB, false);
    ASSERT_TRUE(b.ok());
    bufs.push_back(*std::move(b));
  }
  std::byte* oldest = bufs[0]->data();
  std::byte* newest = bufs[2]->data();
  bufs.clear();  // frees 0, 1, 2 in order: two fit under 20 MiB, the oldest is released
  HostBufferPoolStats s = GetHostBufferPoolStats();
  EXPECT_EQ(s.buffers, 2u);
  EXPECT_LE(s.bytes, 20 * kMiB);
  auto again = HostBuffer::AllocateForOverwrite(8 * kMiB, false);
  ASSERT_TRUE(again.ok());
  EXPECT_NE((*again)->data(), oldest);
  again->reset();

  SetHostBufferPoolLimit(0);
  EXPECT_EQ(GetHostBufferPoolStats().buffers, 0u);
  EXPECT_EQ(GetHostBufferPoolStats().bytes, 0u);
  auto unpooled = HostBuffer::AllocateForOverwrite(8 * kMiB, false);
  ASSERT_TRUE(unpooled.ok());
  unpooled->reset();
  EXPECT_EQ(GetHostBufferPoolStats().buffers, 0u);
  (void)newest;
}

// Many threads taking and returning buffers at once (run under TSan by tools/dev test --tsan).
TEST(HostBufferPoolTest, ConcurrentUse) {
  HostBufferPoolScope scope(64 * kMiB);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([t] {
      for (int i = 0; i < 20; ++i) {
        auto b = HostBuffer::AllocateForOverwrite((4 + (t + i) % 3) * kMiB, false);
        ASSERT_TRUE(b.ok());
        std::memset((*b)->data(), t, (*b)->size());
        EXPECT_EQ(static_cast<int>((*b)->data()[(*b)->size() - 1]), t);
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_LE(GetHostBufferPoolStats().bytes, 64 * kMiB);
}

// A copy large enough to be split over threads, with op sizes that do not line up with the
// split points, lands every byte where it belongs and nothing else.
TEST(HostBackendTest, LargeCopySplitAcrossThreads) {
  std::unique_ptr<DeviceBackend> backend = MakeHostBackend();
  const std::vector<uint64_t> sizes = {33 * kMiB + 7, 1, 17 * kMiB + 4093, 0, 29 * kMiB + 1};
  uint64_t total = 0;
  for (uint64_t n : sizes) total += n;
  auto arena = backend->AllocateArena(total + 4096 * sizes.size());
  ASSERT_TRUE(arena.ok()) << arena.status();
  std::vector<std::byte> src(total);
  for (uint64_t i = 0; i < total; ++i) src[i] = static_cast<std::byte>((i * 131 + 7) % 251);
  std::vector<CopyOp> ops;
  uint64_t from = 0, to = 0;
  for (uint64_t n : sizes) {
    ops.push_back({*arena + to, src.data() + from, n});
    from += n;
    to += n + 4096;  // gaps between destinations stay untouched
  }
  std::memset(*arena, 0xee, total + 4096 * sizes.size());
  ASSERT_TRUE(backend->Copy(ops).ok());
  from = 0;
  to = 0;
  for (uint64_t n : sizes) {
    ASSERT_EQ(std::memcmp(*arena + to, src.data() + from, n), 0) << "op of " << n << " bytes";
    EXPECT_EQ((*arena)[to + n], std::byte{0xee});
    from += n;
    to += n + 4096;
  }
  backend->FreeArena(*arena);
}

}  // namespace
}  // namespace loradb::tiers
