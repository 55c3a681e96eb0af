// A mutex ThreadSanitizer can see, with Abseil's thread-safety annotations and absl::Mutex-like
// Await. Debian's Abseil is not built with TSan, so absl::Mutex synchronisation is invisible to
// it and every guarded access looks like a race (tools/dev test --tsan); std::mutex goes
// through pthread, which TSan intercepts. Every Unlock (and every Await that starts waiting)
// wakes the threads blocked in Await so they re-check their predicates, as absl::Mutex
// conditions are re-evaluated whenever the mutex is released.
#ifndef LORADB_STORAGE_TIERS_SYNC_H_
#define LORADB_STORAGE_TIERS_SYNC_H_

#include <chrono>
#include <condition_variable>
#include <mutex>

#include "absl/base/thread_annotations.h"
#include "absl/time/time.h"
#include "storage/util/mutex.h"

namespace loradb::tiers {

class ABSL_LOCKABLE Mutex {
 public:
  Mutex() = default;
  Mutex(const Mutex&) = delete;
  Mutex& operator=(const Mutex&) = delete;

  void Lock() ABSL_EXCLUSIVE_LOCK_FUNCTION() { mu_.lock(); }
  void Unlock() ABSL_UNLOCK_FUNCTION() {
    // Notify before unlocking: a woken waiter may destroy this mutex once it can lock it.
    if (waiters_ > 0) cv_.notify_all();
    mu_.unlock();
  }
  // Documents (for the analysis) that the caller holds the mutex.
  void AssertHeld() const ABSL_ASSERT_EXCLUSIVE_LOCK() {}

  // Blocks, with the mutex held on entry and exit, until `pred()` is true.
  template <typename Pred>
  void Await(Pred pred) ABSL_EXCLUSIVE_LOCKS_REQUIRED(this) {
    if (pred()) return;
    std::unique_lock<std::mutex> lock(mu_, std::adopt_lock);
    // What this thread changed since it locked may satisfy other waiters: wake them once
    // (not on every re-wait, so two waiters cannot wake each other forever).
    if (waiters_ > 0) cv_.notify_all();
    ++waiters_;
    cv_.wait(lock, pred);
    --waiters_;
    lock.release();
  }

  // Like Await, giving up after `timeout`; returns pred()'s final value.
  template <typename Pred>
  bool AwaitWithTimeout(Pred pred, absl::Duration timeout) ABSL_EXCLUSIVE_LOCKS_REQUIRED(this) {
    if (pred()) return true;
    std::unique_lock<std::mutex> lock(mu_, std::adopt_lock);
    if (waiters_ > 0) cv_.notify_all();
    ++waiters_;
    bool ok = cv_.wait_for(lock, absl::ToChronoNanoseconds(timeout), pred);
    --waiters_;
    lock.release();
    return ok;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  int waiters_ = 0;  // guarded by mu_
};

// Holds a Mutex for a scope.
using MutexLock = BasicMutexLock<Mutex>;

}  // namespace loradb::tiers

#endif  // LORADB_STORAGE_TIERS_SYNC_H_
