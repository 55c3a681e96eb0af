// Mutexes ThreadSanitizer can see, with Abseil's thread-safety annotations. Debian's Abseil is
// not built with TSan, so absl::Mutex synchronisation is invisible to it and every access it
// guards is reported as a race (tools/dev test --tsan); std::mutex and std::shared_mutex go
// through pthread, which TSan intercepts. Use these where absl::Mutex would only be locked
// (no Await/CondVar); storage/tiers/sync.h has the variant with Await.
#ifndef LORADB_STORAGE_UTIL_MUTEX_H_
#define LORADB_STORAGE_UTIL_MUTEX_H_

#include <mutex>
#include <shared_mutex>

#include "absl/base/thread_annotations.h"

namespace loradb {

// An exclusive lock.
class ABSL_LOCKABLE Mutex {
 public:
  Mutex() = default;
  Mutex(const Mutex&) = delete;
  Mutex& operator=(const Mutex&) = delete;
  void Lock() ABSL_EXCLUSIVE_LOCK_FUNCTION() { mu_.lock(); }
  void Unlock() ABSL_UNLOCK_FUNCTION() { mu_.unlock(); }

 private:
  std::mutex mu_;
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
