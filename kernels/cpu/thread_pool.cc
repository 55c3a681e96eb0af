#include "kernels/cpu/thread_pool.h"

namespace loradb::kernels::cpu_internal {

ThreadPool::ThreadPool(int num_threads) {
  for (int t = 1; t < num_threads; ++t) workers_.emplace_back([this, t] { WorkerLoop(t); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  work_cv_.notify_all();
  for (auto& w : workers_) w.join();
}

void ThreadPool::RunItems(uint32_t gen, int64_t num_items,
                          const std::function<void(int64_t, int)>* fn, int thread) {
  for (;;) {
    uint64_t v = claim_.load(std::memory_order_acquire);
    for (;;) {
      if ((v >> 32) != gen || static_cast<int64_t>(v & 0xffffffffu) >= num_items) return;
      if (claim_.compare_exchange_weak(v, v + 1, std::memory_order_acq_rel)) break;
    }
    (*fn)(static_cast<int64_t>(v & 0xffffffffu), thread);
    if (done_.fetch_add(1, std::memory_order_acq_rel) + 1 == num_items) {
      std::lock_guard<std::mutex> lock(mu_);
      done_cv_.notify_all();
    }
  }
}

void ThreadPool::WorkerLoop(int thread) {
  uint32_t seen = 0;
  for (;;) {
    const std::function<void(int64_t, int)>* fn;
    int64_t num_items;
    {
      std::unique_lock<std::mutex> lock(mu_);
      work_cv_.wait(lock, [&] { return stop_ || generation_ != seen; });
      if (stop_) return;
      seen = generation_;
      fn = fn_;
      num_items = num_items_;
    }
    RunItems(seen, num_items, fn, thread);
  }
}

void ThreadPool::ParallelFor(int64_t num_items, const std::function<void(int64_t, int)>& fn) {
  if (workers_.empty() || num_items <= 1) {
    for (int64_t i = 0; i < num_items; ++i) fn(i, 0);
    return;
  }
  uint32_t gen;
  {
    std::lock_guard<std::mutex> lock(mu_);
    gen = ++generation_;
    fn_ = &fn;
    num_items_ = num_items;
    done_.store(0, std::memory_order_relaxed);
    claim_.store(static_cast<uint64_t>(gen) << 32, std::memory_order_release);
  }
  work_cv_.notify_all();
  RunItems(gen, num_items, &fn, 0);
  std::unique_lock<std::mutex> lock(mu_);
  done_cv_.wait(lock, [&] { return done_.load(std::memory_order_acquire) == num_items; });
}

}  // namespace loradb::kernels::cpu_internal
