#include <gtest/gtest.h>

#include <cstring>

#include "storage/tiers/host_buffer.h"
#include "storage/tiers/host_buffer_pool.h"

namespace loradb::tiers {
namespace {

constexpr uint64_t kBig = uint64_t{6} << 20;  // mapped (>= 4 MiB), capacity 6 MiB

// The pool is process-wide: every test starts and ends with it off and empty.
class HostBufferPoolTest : public ::testing::Test {
 protected:
  void SetUp() override { SetHostBufferPoolLimit(0); }
  void TearDown() override { SetHostBufferPoolLimit(0); }
};

TEST_F(HostBufferPoolTest, OffByDefaultNothingIsKept) {
  { auto b = HostBuffer::Allocate(kBig, false); }
  HostBufferPoolStats s = GetHostBufferPoolStats();
  EXPECT_EQ(s.limit_bytes, 0u);
  EXPECT_EQ(s.pooled_buffers, 0u);
  EXPECT_EQ(s.reused, 0u);
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
  EXPECT_EQ(GetHostBufferPoolStats().reused, 1u);
  EXPECT_EQ(GetHostBufferPoolStats().pooled_buffers, 0u);
  // A different capacity maps fresh memory.
  auto other = *HostBuffer::Allocate(kBig * 2, false);
  EXPECT_NE(other->data(), first);
  EXPECT_EQ(GetHostBufferPoolStats().fresh, 2u);
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

}  // namespace
}  // namespace loradb::tiers
