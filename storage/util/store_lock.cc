#include "storage/util/store_lock.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>

#include "absl/strings/str_cat.h"
#include "storage/util/file_util.h"

namespace loradb {

absl::StatusOr<StoreLock> StoreLock::Acquire(const std::string& dir, Mode mode) {
  const std::string path = absl::StrCat(dir, "/LOCK");
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) return ErrnoToStatus(errno, absl::StrCat("open store lock ", path));
  const int op = (mode == Mode::kShared ? LOCK_SH : LOCK_EX) | LOCK_NB;
  int rc;
  do {
    rc = ::flock(fd, op);
  } while (rc != 0 && errno == EINTR);
  if (rc != 0) {
    const int err = errno;
    ::close(fd);
    if (err == EWOULDBLOCK) {
      if (mode == Mode::kExclusive) {
        return absl::UnavailableError(absl::StrCat(
            "store '", dir,
            "' is in use: a writer or server (a process with the store open) holds its lock; "
            "stop it and retry (offline maintenance needs the store to itself)"));
      }
      return absl::UnavailableError(
          absl::StrCat("store '", dir,
                       "' is locked by offline maintenance (compact or migrate); retry when it "
                       "finishes"));
    }
    return ErrnoToStatus(err, absl::StrCat("lock ", path));
  }
  return StoreLock(fd);
}

StoreLock::StoreLock(StoreLock&& other) noexcept : fd_(other.fd_) { other.fd_ = -1; }

StoreLock& StoreLock::operator=(StoreLock&& other) noexcept {
  if (this != &other) {
    Release();
    fd_ = other.fd_;
    other.fd_ = -1;
  }
  return *this;
}

StoreLock::~StoreLock() { Release(); }

void StoreLock::Release() {
  if (fd_ >= 0) {
    ::close(fd_);  // drops the flock
    fd_ = -1;
  }
}

}  // namespace loradb
