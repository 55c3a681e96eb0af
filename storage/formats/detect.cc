#include "storage/formats/detect.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "storage/formats/blob.h"
#include "storage/formats/peft.h"
#include "storage/util/file_util.h"

namespace loradb {

absl::string_view TensorFormatName(TensorFormat format) {
  switch (format) {
    case TensorFormat::kSafetensors:
      return "safetensors";
    case TensorFormat::kShardedIndex:
      return "sharded";
    case TensorFormat::kPeftDir:
      return "peft";
    case TensorFormat::kBlob:
      return "blob";
  }
  return "unknown";
}

absl::StatusOr<TensorFormat> DetectTensorFormat(const std::string& path) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) return ErrnoToStatus(errno, absl::StrCat("stat ", path));
  if (S_ISDIR(st.st_mode)) {
    std::string config = absl::StrCat(path, "/", peft::kConfigFile);
    if (::access(config.c_str(), F_OK) == 0) return TensorFormat::kPeftDir;
    return absl::InvalidArgumentError(absl::StrCat(
        path, " is a directory without ", peft::kConfigFile, " (not a PEFT adapter directory)"));
  }
  if (!S_ISREG(st.st_mode)) {
    return absl::InvalidArgumentError(absl::StrCat(path, " is not a regular file"));
  }
  unsigned char head[8] = {};
  ssize_t got = 0;
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return ErrnoToStatus(errno, absl::StrCat("open ", path));
  while (got < 8) {
    ssize_t n = ::read(fd, head + got, static_cast<size_t>(8 - got));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    got += n;
  }
  ::close(fd);
  if (got == 8 && std::memcmp(head, kBlobMagic, 8) == 0) return TensorFormat::kBlob;
  if (absl::EndsWith(path, ".json")) return TensorFormat::kShardedIndex;
  if (got == 8) {
    uint64_t n = 0;
    for (int i = 7; i >= 0; --i) n = (n << 8) | head[i];
    bool plausible_safetensors = n <= static_cast<uint64_t>(st.st_size) - 8;
    size_t first = 0;
    while (first < 8 && (head[first] == ' ' || head[first] == '\n' || head[first] == '\r' ||
                         head[first] == '\t')) {
      ++first;
    }
    if (!plausible_safetensors && first < 8 && head[first] == '{') {
      return TensorFormat::kShardedIndex;
    }
  }
  return TensorFormat::kSafetensors;
}

}  // namespace loradb
