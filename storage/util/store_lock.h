// The store-wide lock: `<store>/LOCK`, an flock(2) lock. Everything that writes the store in the
// normal way (a Store, a server) holds it shared; offline maintenance (compact, migrate) holds it
// exclusively, so it never runs beside a live writer. The kernel drops the lock when the
// process dies, so a crash never leaves a store locked. flock locks belong to an open file
// description: two StoreLocks in one process conflict like two processes.
#ifndef LORADB_STORAGE_UTIL_STORE_LOCK_H_
#define LORADB_STORAGE_UTIL_STORE_LOCK_H_

#include <string>

#include "absl/status/statusor.h"

namespace loradb {

class StoreLock {
 public:
  enum class Mode { kShared, kExclusive };

  // Takes the lock of the store directory `dir` (which must exist) without waiting.
  // Unavailable, with a message saying who may hold it, when the lock is held in a conflicting
  // mode; other errors for I/O failures.
  [[nodiscard]] static absl::StatusOr<StoreLock> Acquire(const std::string& dir, Mode mode);

  StoreLock() = default;
  StoreLock(StoreLock&& other) noexcept;
  StoreLock& operator=(StoreLock&& other) noexcept;
  StoreLock(const StoreLock&) = delete;
  StoreLock& operator=(const StoreLock&) = delete;
  ~StoreLock();

  bool held() const { return fd_ >= 0; }
  // Releases the lock now (also done by the destructor).
  void Release();

 private:
  explicit StoreLock(int fd) : fd_(fd) {}
  int fd_ = -1;
};

}  // namespace loradb

#endif  // LORADB_STORAGE_UTIL_STORE_LOCK_H_
