// A small fixed pool of worker threads for the fast CPU kernels. Internal to kernels/cpu.
#ifndef LORADB_KERNELS_CPU_THREAD_POOL_H_
#define LORADB_KERNELS_CPU_THREAD_POOL_H_

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace loradb::kernels::cpu_internal {

class ThreadPool {
 public:
  // `num_threads` counts the calling thread: num_threads - 1 workers are started.
  explicit ThreadPool(int num_threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int num_threads() const { return static_cast<int>(workers_.size()) + 1; }

  // Runs fn(item, thread) for every item in [0, num_items) on the caller and the workers;
  // `thread` is in [0, num_threads()) and unique among concurrently running calls. Returns when
  // all items are done; it never waits for a worker that has not claimed an item (a worker
  // descheduled by other busy threads, e.g. spinning OpenMP threads, only slows the call down
  // by the items it actually took). Not reentrant: one ParallelFor at a time per pool.
  void ParallelFor(int64_t num_items, const std::function<void(int64_t, int)>& fn);

 private:
  void WorkerLoop(int thread);
  // Claims and runs items of generation `gen` until none are left (or a newer call started).
  // `fn` is only dereferenced after an item was claimed (a late worker's call may be over).
  void RunItems(uint32_t gen, int64_t num_items, const std::function<void(int64_t, int)>* fn,
                int thread);

  std::vector<std::thread> workers_;
  std::mutex mu_;
  std::condition_variable work_cv_;
  std::condition_variable done_cv_;
  uint32_t generation_ = 0;                                // guarded by mu_
  bool stop_ = false;                                      // guarded by mu_
  const std::function<void(int64_t, int)>* fn_ = nullptr;  // guarded by mu_
  int64_t num_items_ = 0;                                  // guarded by mu_
  // generation << 32 | next unclaimed item. Items are claimed with a compare-exchange that
  // checks the generation, so a worker that wakes late never takes part in a later call.
  std::atomic<uint64_t> claim_{0};
  std::atomic<int64_t> done_{0};  // items of the current call finished
};

}  // namespace loradb::kernels::cpu_internal

#endif  // LORADB_KERNELS_CPU_THREAD_POOL_H_
