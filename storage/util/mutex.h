// The project's mutexes: ThreadSanitizer can see them, and they carry Abseil's thread-safety
// annotations, so members are ABSL_GUARDED_BY(mu_) and the compiler checks the locking.
// Debian's Abseil is not built with TSan, so absl::Mutex synchronisation is invisible to it and
// every access it guards is reported as a race (tools/dev test --tsan); std::mutex,
// std::shared_mutex and std::condition_variable go through pthread, which TSan intercepts.
//
// Mutex also has absl::Mutex-style condition waits (Await, AwaitWithTimeout): every Unlock (and
// every Await that starts waiting) wakes the threads blocked in Await so they re-check their
// predicates, as absl::Mutex conditions are re-evaluated whenever the mutex is released.
#ifndef LORADB_STORAGE_UTIL_MUTEX_H_
#define LORADB_STORAGE_UTIL_MUTEX_H_

#include <condition_variable>
#include <mutex>
#include <shared_mutex>

#include "absl/base/thread_annotations.h"
#include "absl/time/time.h"

namespace loradb {

// An exclusive lock with condition waits.
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

  // Blocks, with the mutex held on entry and exit, until `pred()` is true. `pred` runs with the
  // mutex held; a lambda reading guarded members is marked ABSL_NO_THREAD_SAFETY_ANALYSIS,
  // since the analysis cannot see that.
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
    const bool ok = cv_.wait_for(lock, absl::ToChronoNanoseconds(timeout), pred);
    --waiters_;
    lock.release();
    return ok;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  int waiters_ = 0;  // threads blocked in Await; guarded by mu_
};

// A reader/writer lock: many readers or one writer.
class ABSL_LOCKABLE SharedMutex {
 public:
  SharedMutex() = default;
  SharedMutex(const SharedMutex&) = delete;
  SharedMutex& operator=(const SharedMutex&) = delete;
  void Lock() ABSL_EXCLUSIVE_LOCK_FUNCTION() { mu_.lock(); }
  void Unlock() ABSL_UNLOCK_FUNCTION() { mu_.unlock(); }
  void ReaderLock() ABSL_SHARED_LOCK_FUNCTION() { mu_.lock_shared(); }
  void ReaderUnlock() ABSL_UNLOCK_FUNCTION() { mu_.unlock_shared(); }

 private:
  std::shared_mutex mu_;
};

// Holds a Mutex (or a SharedMutex exclusively) for a scope.
template <typename M>
class ABSL_SCOPED_LOCKABLE BasicMutexLock {
 public:
  explicit BasicMutexLock(M* mu) ABSL_EXCLUSIVE_LOCK_FUNCTION(mu) : mu_(mu) { mu_->Lock(); }
  ~BasicMutexLock() ABSL_UNLOCK_FUNCTION() { mu_->Unlock(); }
  BasicMutexLock(const BasicMutexLock&) = delete;
  BasicMutexLock& operator=(const BasicMutexLock&) = delete;

 private:
  M* const mu_;
};
using MutexLock = BasicMutexLock<Mutex>;
using WriterMutexLock = BasicMutexLock<SharedMutex>;

// Holds a SharedMutex shared for a scope.
class ABSL_SCOPED_LOCKABLE ReaderMutexLock {
 public:
  explicit ReaderMutexLock(SharedMutex* mu) ABSL_SHARED_LOCK_FUNCTION(mu) : mu_(mu) {
    mu_->ReaderLock();
  }
  ~ReaderMutexLock() ABSL_UNLOCK_FUNCTION() { mu_->ReaderUnlock(); }
  ReaderMutexLock(const ReaderMutexLock&) = delete;
  ReaderMutexLock& operator=(const ReaderMutexLock&) = delete;

 private:
  SharedMutex* const mu_;
};

}  // namespace loradb

#endif  // LORADB_STORAGE_UTIL_MUTEX_H_
