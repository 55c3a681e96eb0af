// The fast path's thread pool: every item runs exactly once per call, on distinct thread ids,
// across many back-to-back calls (run under TSan with `tools/dev test --tsan`).
#include "kernels/cpu/thread_pool.h"

#include <gtest/gtest.h>

#include <atomic>
#include <vector>

namespace loradb::kernels::cpu_internal {
namespace {

TEST(ThreadPool, RunsEveryItemOnceAcrossManyCalls) {
  for (int threads : {1, 2, 4}) {
    ThreadPool pool(threads);
    EXPECT_EQ(pool.num_threads(), threads);
    for (int call = 0; call < 300; ++call) {
      const int64_t n = call % 17;
      std::vector<std::atomic<int>> hits(static_cast<size_t>(n));
      std::atomic<int> bad_thread{0};
      pool.ParallelFor(n, [&](int64_t item, int thread) {
        if (thread < 0 || thread >= threads) bad_thread.fetch_add(1);
        hits[static_cast<size_t>(item)].fetch_add(1);
      });
      for (int64_t i = 0; i < n; ++i) {
        ASSERT_EQ(hits[static_cast<size_t>(i)].load(), 1) << "call " << call << " item " << i;
      }
      EXPECT_EQ(bad_thread.load(), 0);
    }
  }
}

TEST(ThreadPool, ThreadIdsAreExclusiveWhileRunning) {
  ThreadPool pool(3);
  std::vector<std::atomic<int>> busy(3);
  std::atomic<int> overlaps{0};
  pool.ParallelFor(200, [&](int64_t, int thread) {
    if (busy[static_cast<size_t>(thread)].fetch_add(1) != 0) overlaps.fetch_add(1);
    volatile int spin = 0;
    for (int i = 0; i < 1000; ++i) spin = spin + i;
    busy[static_cast<size_t>(thread)].fetch_sub(1);
  });
  EXPECT_EQ(overlaps.load(), 0);
}

}  // namespace
}  // namespace loradb::kernels::cpu_internal
