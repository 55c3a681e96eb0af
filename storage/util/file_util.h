// Small POSIX file helpers with absl::Status errors: whole-file reads, crash-safe writes
// (temp name + fsync + rename + directory fsync), read-only memory maps.
#ifndef LORADB_STORAGE_UTIL_FILE_UTIL_H_
#define LORADB_STORAGE_UTIL_FILE_UTIL_H_

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace loradb {

// Maps errno `err` to an absl::Status whose message is "`what`: strerror(err)".
// ENOENT/ENOTDIR -> NotFound, ENOSPC/EDQUOT/ENOMEM -> ResourceExhausted, EACCES/EPERM/EROFS ->
// PermissionDenied, EEXIST -> AlreadyExists, EINVAL -> InvalidArgument, EBADF/EFAULT (a bad
// descriptor or address: a bug of ours) -> Internal, everything else (EIO, ENXIO, ESTALE, ...: the
// system could not do the I/O) -> Unknown, which the C API reports as LORADB_IO_ERROR.
absl::Status ErrnoToStatus(int err, absl::string_view what);

// Reads the whole file at `path`.
[[nodiscard]] absl::StatusOr<std::string> ReadFileToString(const std::string& path);

// Writes `data` to `path` crash-safely: a temp file in the same directory, fsync, rename over
// `path`, fsync of the directory. On error the temp file is removed and `path` is untouched.
[[nodiscard]] absl::Status WriteFileAtomic(const std::string& path, absl::string_view data);

// fsyncs the directory `dir` so renames and creations inside it are durable.
[[nodiscard]] absl::Status FsyncDirectory(const std::string& dir);

// Creates `dir` and its parents if missing (like `mkdir -p`).
[[nodiscard]] absl::Status CreateDirectories(const std::string& dir);

// A read-only, private memory map of a whole file. Empty files map to an empty span.
// Move-only; unmaps on destruction.
class MappedFile {
 public:
  [[nodiscard]] static absl::StatusOr<MappedFile> Open(const std::string& path);

  MappedFile() = default;
  MappedFile(MappedFile&& other) noexcept;
  MappedFile& operator=(MappedFile&& other) noexcept;
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  ~MappedFile();

  std::span<const std::byte> bytes() const { return {data_, size_}; }
  const std::byte* data() const { return data_; }
  size_t size() const { return size_; }
  const std::string& path() const { return path_; }

 private:
  const std::byte* data_ = nullptr;
  size_t size_ = 0;
  std::string path_;
};

}  // namespace loradb

#endif  // LORADB_STORAGE_UTIL_FILE_UTIL_H_
