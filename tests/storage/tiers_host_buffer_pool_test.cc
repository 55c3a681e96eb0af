#include <gtest/gtest.h>

#include <cstring>
#include <thread>
#include <vector>

#include "storage/tiers/host_buffer.h"
#include "storage/tiers/host_buffer_pool.h"

namespace loradb::tiers {
namespace {

constexpr uint64_t kBig = uint64_t{6} << 20;  // mapped (>= 4 MiB), capacity 6 MiB

// The pool is process-wide: every test starts and ends with it off and empty.
class HostBufferPoolTest : public ::testing::Test {
 protected:
  void SetUp() override {
    SetHostBufferPoolLimit(0);
    base_ = GetHostBufferPoolStats();  // counters are cumulative over the process
  }
  uint64_t Reused() const { return GetHostBufferPoolStats().reused - base_.reused; }
  uint64_t Fresh() const { return GetHostBufferPoolStats().fresh - base_.fresh; }
  HostBufferPoolStats base_;
  void TearDown() override { SetHostBufferPoolLimit(0); }
};

TEST_F(HostBufferPoolTest, OffByDefaultNothingIsKept) {
  { auto b = HostBuffer::Allocate(kBig, false); }
  HostBufferPoolStats s = GetHostBufferPoolStats();
  EXPECT_EQ(s.limit_bytes, 0u);
  EXPECT_EQ(s.pooled_buffers, 0u);
  EXPECT_EQ(Reused(), 0u);
}

TEST_F(HostBufferPoolTest, ReleasedBufferIsReusedForTheSameCapacity) {
  SetHostBufferPoolLimit(64 << 20);
  std::byte* first = nullptr;
  {
    auto b = *HostBuffer::Allocate(kBig, false);
    first = b->data();
    std::memset(b->data(), 7, kBig);
  }
  EXPECT_EQ(GetHostBufferPoolStats().pooled_buffers, 1u);
  auto again = *HostBuffer::Allocate(kBig - 4096, false);  // same 2 MiB-rounded capacity
  EXPECT_EQ(again->data(), first);
  EXPECT_EQ(again->size(), kBig - 4096);
  EXPECT_EQ(Reused(), 1u);
  EXPECT_EQ(GetHostBufferPoolStats().pooled_buffers, 0u);
  // A different capacity maps fresh memory.
  auto other = *HostBuffer::Allocate(kBig * 2, false);
  EXPECT_NE(other->data(), first);
  EXPECT_EQ(Fresh(), 2u);
}

TEST_F(HostBufferPoolTest, LimitBoundsWhatIsKeptAndLoweringItUnmaps) {
  SetHostBufferPoolLimit(kBig);  // room for exactly one 6 MiB buffer
  {
    auto a = *HostBuffer::Allocate(kBig, false);
    auto b = *HostBuffer::Allocate(kBig, false);
  }
  HostBufferPoolStats s = GetHostBufferPoolStats();
  EXPECT_EQ(s.pooled_buffers, 1u);
  EXPECT_EQ(s.pooled_bytes, kBig);
  SetHostBufferPoolLimit(0);
  EXPECT_EQ(GetHostBufferPoolStats().pooled_buffers, 0u);
  EXPECT_EQ(GetHostBufferPoolStats().pooled_bytes, 0u);
}

TEST_F(HostBufferPoolTest, SmallBuffersAreNeverPooled) {
  SetHostBufferPoolLimit(64 << 20);
  { auto b = *HostBuffer::Allocate(1 << 20, false); }
  EXPECT_EQ(GetHostBufferPoolStats().pooled_buffers, 0u);
}

TEST_F(HostBufferPoolTest, ReserveFaultsInBuffersAheadOfUse) {
  ASSERT_TRUE(ReserveHostBuffers(kBig, 3, false).ok());
  HostBufferPoolStats s = GetHostBufferPoolStats();
  EXPECT_EQ(s.pooled_buffers, 3u);
  EXPECT_GE(s.limit_bytes, 3 * kBig);
  // Reserving again counts the idle ones: still 3.
  ASSERT_TRUE(ReserveHostBuffers(kBig, 3, false).ok());
  EXPECT_EQ(GetHostBufferPoolStats().pooled_buffers, 3u);
  uint64_t reused_before = GetHostBufferPoolStats().reused;
  {
    auto a = *HostBuffer::Allocate(kBig, false);
    auto b = *HostBuffer::Allocate(kBig, false);
    auto c = *HostBuffer::Allocate(kBig, false);
    EXPECT_EQ(GetHostBufferPoolStats().reused, reused_before + 3);
    EXPECT_EQ(GetHostBufferPoolStats().pooled_buffers, 0u);
  }
  EXPECT_EQ(GetHostBufferPoolStats().pooled_buffers, 3u);
}

TEST_F(HostBufferPoolTest, ReserveRejectsBadInputAndChangesNothing) {
  EXPECT_EQ(ReserveHostBuffers(kBig, 0, false).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ReserveHostBuffers(1 << 20, 2, false).code(), absl::StatusCode::kInvalidArgument);
  HostBufferPoolStats s = GetHostBufferPoolStats();
  EXPECT_EQ(s.limit_bytes, 0u);
  EXPECT_EQ(s.pooled_buffers, 0u);
}

// Threads allocate, write and release buffers of two capacities while the pool recycles them
// (run under TSan by tools/dev test --tsan): every buffer a thread holds is its own.
TEST_F(HostBufferPoolTest, ConcurrentAllocateAndReleaseShareNothing) {
  SetHostBufferPoolLimit(4 * kBig);
  std::vector<std::thread> threads;
  std::vector<int> bad(4, 0);
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([t, &bad] {
      for (int i = 0; i < 50; ++i) {
        auto b = *HostBuffer::Allocate(i % 2 == 0 ? kBig : 2 * kBig, false);
        std::memset(b->data(), t + 1, 4096);
        for (int k = 0; k < 4096; ++k) bad[t] += b->data()[k] != std::byte(t + 1);
      }
    });
  }
  for (auto& th : threads) th.join();
  for (int t = 0; t < 4; ++t) EXPECT_EQ(bad[t], 0);
  HostBufferPoolStats s = GetHostBufferPoolStats();
  EXPECT_EQ(Reused() + Fresh(), 200u);
  EXPECT_GT(Reused(), 0u);
  EXPECT_LE(s.pooled_bytes, 4 * kBig);
}

}  // namespace
}  // namespace loradb::tiers
