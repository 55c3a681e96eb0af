#include "storage/tiers/tp_shard_load.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <system_error>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "storage/formats/blob.h"
#include "storage/tiers/host_buffer.h"
#include "storage/util/file_util.h"
#include "storage/util/status_macros.h"

namespace loradb::tiers {
namespace {

constexpr uint64_t kAlign = 64;

class Fd {
 public:
  explicit Fd(int fd) : fd_(fd) {}
  ~Fd() {
    if (fd_ >= 0) close(fd_);
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  int get() const { return fd_; }

 private:
  int fd_;
};

absl::Status PreadFull(int fd, std::byte* dst, uint64_t len, uint64_t offset,
                       const std::string& path, ShardReadStats* stats) {
  while (len > 0) {
    const ssize_t n = pread(fd, dst, len, static_cast<off_t>(offset));
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoToStatus(errno, absl::StrCat("pread ", path));
    }
    if (n == 0) return absl::DataLossError(absl::StrCat(path, ": unexpected end of file"));
    ++stats->reads;
    stats->bytes_read += static_cast<uint64_t>(n);
    dst += n;
    len -= static_cast<uint64_t>(n);
    offset += static_cast<uint64_t>(n);
  }
  return absl::OkStatus();
}

absl::StatusOr<TensorSet> ReadPartial(const std::string& path, const TpShardSpec& spec,
                                      ShardReadStats* stats) {
  Fd fd(open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (fd.get() < 0) return ErrnoToStatus(errno, absl::StrCat("open ", path));
  struct stat st;
  if (fstat(fd.get(), &st) != 0) return ErrnoToStatus(errno, absl::StrCat("fstat ", path));
  const auto file_size = static_cast<uint64_t>(st.st_size);
  if (file_size < kBlobPrefixBytes) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": too short for a blob"));
  }
  std::vector<std::byte> head(kBlobPrefixBytes);
  LORADB_RETURN_IF_ERROR(PreadFull(fd.get(), head.data(), head.size(), 0, path, stats));
  LORADB_ASSIGN_OR_RETURN(uint64_t header_end, BlobHeaderEnd(head));
  if (header_end > file_size) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": header runs past the file end"));
  }
  head.resize(header_end);
  LORADB_RETURN_IF_ERROR(PreadFull(fd.get(), head.data() + kBlobPrefixBytes,
                                   header_end - kBlobPrefixBytes, kBlobPrefixBytes, path, stats));
  LORADB_ASSIGN_OR_RETURN(BlobLayout layout, ParseBlobLayout(head, file_size));

  std::vector<int> group_of(layout.stored.size(), -1);
  for (size_t g = 0; g < layout.groups.size(); ++g) {
    if (layout.groups[g].axis != 0) {
      return absl::UnimplementedError(absl::StrCat(path, ": packed group stacked along axis ",
                                                   layout.groups[g].axis, " (only 0 is read)"));
    }
    group_of[layout.groups[g].stored_index] = static_cast<int>(g);
  }
  struct Plan {
    int split = -1;
    std::vector<int64_t> shape;  // sliced
    uint64_t bytes = 0;
    uint64_t offset = 0;  // in the buffer
  };
  std::vector<Plan> plans(layout.stored.size());
  uint64_t total = 0;
  for (size_t i = 0; i < layout.stored.size(); ++i) {
    const BlobStoredTensor& s = layout.stored[i];
    Plan& p = plans[i];
    LORADB_ASSIGN_OR_RETURN(p.split, TpSplitDim(AdapterTensorAxis(s.name), s.shape.size(), s.name));
    p.shape = s.shape;
    p.bytes = s.length;
    if (p.split >= 0) {
      const int64_t dim = s.shape[static_cast<size_t>(p.split)];
      if (dim % spec.degree != 0) {
        return absl::InvalidArgumentError(absl::StrCat(
            "tensor \"", s.name, "\" (shape ", ShapeString(s.shape), ") has dimension ", p.split,
            " = ", dim, ", not divisible by the TP degree ", spec.degree));
      }
      p.shape[static_cast<size_t>(p.split)] = dim / spec.degree;
      p.bytes = s.length / static_cast<uint64_t>(spec.degree);
    }
    p.offset = total;
    total = AlignUp(total + p.bytes, kAlign);
  }
  LORADB_ASSIGN_OR_RETURN(std::unique_ptr<HostBuffer> owned,
                          HostBuffer::Allocate(total == 0 ? kAlign : total, false));
  std::shared_ptr<HostBuffer> buf(std::move(owned));
  stats->verified = true;
  for (size_t i = 0; i < layout.stored.size(); ++i) {
    const BlobStoredTensor& s = layout.stored[i];
    const Plan& p = plans[i];
    std::byte* dst = buf->data() + p.offset;
    if (p.split < 0) {
      LORADB_RETURN_IF_ERROR(PreadFull(fd.get(), dst, s.length, s.offset, path, stats));
      if (Xxh3_64(dst, s.length) != s.xxh3) {
        return absl::DataLossError(
            absl::StrCat(path, ": checksum mismatch in tensor \"", s.name, "\""));
      }
      continue;
    }
    // Rank's run in each outer block; adjacent runs never touch (the others' slices lie
    // between), so one pread per block.
    uint64_t outer = 1, inner = DTypeSize(s.dtype);
    for (size_t d = 0; d < s.shape.size(); ++d) {
      if (static_cast<int>(d) < p.split) outer *= static_cast<uint64_t>(s.shape[d]);
      if (static_cast<int>(d) > p.split) inner *= static_cast<uint64_t>(s.shape[d]);
    }
    const uint64_t dim = static_cast<uint64_t>(s.shape[static_cast<size_t>(p.split)]);
    const uint64_t chunk = dim / static_cast<uint64_t>(spec.degree) * inner;
    const uint64_t start = static_cast<uint64_t>(spec.rank) * chunk;
    if (outer == 1 || spec.degree == 1) {
      LORADB_RETURN_IF_ERROR(
          PreadFull(fd.get(), dst, chunk * outer, s.offset + start, path, stats));
    } else {
      for (uint64_t o = 0; o < outer; ++o) {
        LORADB_RETURN_IF_ERROR(PreadFull(fd.get(), dst + o * chunk, chunk,
                                         s.offset + o * dim * inner + start, path, stats));
      }
    }
    if (spec.degree > 1) {
      stats->verified = false;  // the stored checksum covers the whole tensor
    } else if (Xxh3_64(dst, s.length) != s.xxh3) {
      return absl::DataLossError(
          absl::StrCat(path, ": checksum mismatch in tensor \"", s.name, "\""));
    }
  }

  TensorSet out(buf);
  out.metadata() = layout.metadata;
  for (size_t i = 0; i < layout.stored.size(); ++i) {
    const BlobStoredTensor& s = layout.stored[i];
    const Plan& p = plans[i];
    std::byte* data = buf->data() + p.offset;
    if (group_of[i] < 0) {
      LORADB_RETURN_IF_ERROR(out.Add(TensorView{s.name, s.dtype, p.shape, data, p.bytes}));
      continue;
    }
    const BlobPackedGroup& g = layout.groups[static_cast<size_t>(group_of[i])];
    const auto members = static_cast<uint64_t>(g.members.size());
    if (p.shape.empty() || static_cast<uint64_t>(p.shape[0]) != members) {
      return absl::InvalidArgumentError(absl::StrCat(path, ": packed tensor \"", s.name,
                                                     "\" does not stack its members on axis 0"));
    }
    const std::vector<int64_t> member_shape(p.shape.begin() + 1, p.shape.end());
    const uint64_t member_bytes = p.bytes / members;
    for (uint64_t m = 0; m < members; ++m) {
      LORADB_RETURN_IF_ERROR(out.Add(
          TensorView{g.members[m], s.dtype, member_shape, data + m * member_bytes, member_bytes}));
    }
  }
  return out;
}

}  // namespace

absl::StatusOr<TensorSet> ReadAdapterShardFile(const std::string& blob_path,
                                               const TpShardSpec& spec, ShardReadMode mode,
                                               ShardReadStats* stats) {
  ShardReadStats local;
  if (stats == nullptr) stats = &local;
  *stats = ShardReadStats{};
  LORADB_RETURN_IF_ERROR(ValidateTpShard(spec));
  if (mode == ShardReadMode::kPartial) return ReadPartial(blob_path, spec, stats);
  LORADB_ASSIGN_OR_RETURN(TensorSet whole, ReadBlobFile(blob_path, /*verify=*/true));
  ++stats->reads;
  for (const TensorView& v : whole.tensors()) stats->bytes_read += v.nbytes;
  stats->verified = true;
  return SliceTensors(whole, AdapterTensorAxis, spec);
}

std::string DerivedShardPath(const std::string& cache_dir, const Hash128& source,
                             const TpShardSpec& spec) {
  return absl::StrCat(cache_dir, "/tp", spec.degree, "/", source.Hex(), ".r", spec.rank, ".blob");
}

absl::StatusOr<TensorSet> LoadDerivedShard(const std::string& blob_path, const Hash128& source,
                                           const std::string& cache_dir, const TpShardSpec& spec,
                                           ShardReadStats* stats) {
  ShardReadStats local;
  if (stats == nullptr) stats = &local;
  *stats = ShardReadStats{};
  LORADB_RETURN_IF_ERROR(ValidateTpShard(spec));
  const std::string path = DerivedShardPath(cache_dir, source, spec);
  const std::map<std::string, std::string> want = {
      {kTpDegreeKey, absl::StrCat(spec.degree)},
      {kTpRankKey, absl::StrCat(spec.rank)},
      {kTpSourceKey, source.Hex()},
  };
  struct stat st;
  if (stat(path.c_str(), &st) == 0) {
    // Never served unverified; a bad file is reported, not silently replaced (it may point at a
    // failing disk). Deleting it (or the directory) is always safe: it is rebuilt on demand.
    absl::StatusOr<TensorSet> shard = ReadBlobFile(path, /*verify=*/true);
    if (!shard.ok() && !absl::IsNotFound(shard.status())) {
      return absl::Status(shard.status().code(),
                          absl::StrCat("derived shard: ", shard.status().message(),
                                       " (delete the file to rebuild it from the source blob)"));
    }
    if (shard.ok()) {
      for (const auto& [key, value] : want) {
        auto it = shard->metadata().find(key);
        if (it == shard->metadata().end() || it->second != value) {
          return absl::DataLossError(
              absl::StrCat("derived shard ", path, " has ", key, " = ",
                           it == shard->metadata().end() ? "(none)" : it->second, ", expected ",
                           value, " (delete the file to rebuild it from the source blob)"));
        }
      }
      stats->reads = 1;
      stats->bytes_read = static_cast<uint64_t>(st.st_size);
      stats->verified = true;
      stats->from_derived = true;
      return *std::move(shard);
    }
    // NotFound: a sweep removed it after the stat; rebuild below.
  } else if (errno != ENOENT) {
    return ErrnoToStatus(errno, absl::StrCat("stat ", path));
  }
  LORADB_ASSIGN_OR_RETURN(
      TensorSet shard, ReadAdapterShardFile(blob_path, spec, ShardReadMode::kWholeVerified, stats));
  for (const auto& [key, value] : want) shard.metadata()[key] = value;
  LORADB_RETURN_IF_ERROR(CreateDirectories(absl::StrCat(cache_dir, "/tp", spec.degree)));
  LORADB_RETURN_IF_ERROR(WriteBlobFile(path, shard.tensors(), shard.metadata()).status());
  return shard;
}

namespace {

// "<32 hex>.r<rank>.blob" -> the source hash; nullopt for any other name.
std::optional<Hash128> DerivedSource(const std::string& name) {
  constexpr size_t kHex = 32;
  if (name.size() < kHex + 8 || name.compare(kHex, 2, ".r") != 0 || !name.ends_with(".blob")) {
    return std::nullopt;
  }
  const std::string rank = name.substr(kHex + 2, name.size() - kHex - 2 - 5);
  if (rank.empty() || rank.find_first_not_of("0123456789") != std::string::npos) {
    return std::nullopt;
  }
  absl::StatusOr<Hash128> h = ParseHash128(name.substr(0, kHex));
  if (!h.ok()) return std::nullopt;
  return *h;
}

// The writer's pid of a WriteFileAtomic temp file "<target>.tmp.<pid>.<n>"; 0 for other names.
pid_t TempWriter(const std::string& name) {
  const size_t at = name.rfind(".tmp.");
  if (at == std::string::npos) return 0;
  const size_t dot = name.find('.', at + 5);
  if (dot == std::string::npos) return 0;
  int64_t pid = 0;
  if (!absl::SimpleAtoi(name.substr(at + 5, dot - at - 5), &pid) || pid <= 0) return 0;
  return static_cast<pid_t>(pid);
}

bool ProcessAlive(pid_t pid) { return kill(pid, 0) == 0 || errno != ESRCH; }

// The tp<degree> subdirectories of `cache_dir` (none when it does not exist).
absl::StatusOr<std::vector<std::filesystem::path>> DegreeDirs(const std::string& cache_dir) {
  std::vector<std::filesystem::path> out;
  std::error_code ec;
  std::filesystem::directory_iterator it(cache_dir, ec);
  if (ec == std::errc::no_such_file_or_directory) return out;
  if (ec) return ErrnoToStatus(ec.value(), absl::StrCat("read directory ", cache_dir));
  for (; it != std::filesystem::directory_iterator(); it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (name.size() > 2 && name.starts_with("tp") &&
        name.find_first_not_of("0123456789", 2) == std::string::npos && it->is_directory(ec)) {
      out.push_back(it->path());
    }
  }
  if (ec) return ErrnoToStatus(ec.value(), absl::StrCat("read directory ", cache_dir));
  return out;
}

// The regular files of `dir` (name, size).
absl::StatusOr<std::vector<std::pair<std::string, uint64_t>>> Files(
    const std::filesystem::path& dir) {
  std::vector<std::pair<std::string, uint64_t>> out;
  std::error_code ec;
  std::filesystem::directory_iterator it(dir, ec);
  if (ec == std::errc::no_such_file_or_directory) return out;
  for (; !ec && it != std::filesystem::directory_iterator(); it.increment(ec)) {
    std::error_code fec;
    if (!it->is_regular_file(fec)) continue;
    const uintmax_t size = it->file_size(fec);
    out.emplace_back(it->path().filename().string(), fec ? 0 : static_cast<uint64_t>(size));
  }
  if (ec) return ErrnoToStatus(ec.value(), absl::StrCat("read directory ", dir.string()));
  return out;
}

absl::Status Unlink(const std::filesystem::path& path) {
  if (unlink(path.c_str()) != 0 && errno != ENOENT) {
    return ErrnoToStatus(errno, absl::StrCat("remove ", path.string()));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<uint64_t> RemoveDerivedShards(const std::string& cache_dir, const Hash128& source) {
  uint64_t removed = 0;
  LORADB_ASSIGN_OR_RETURN(std::vector<std::filesystem::path> dirs, DegreeDirs(cache_dir));
  for (const std::filesystem::path& dir : dirs) {
    LORADB_ASSIGN_OR_RETURN(auto files, Files(dir));
    for (const auto& [name, size] : files) {
      std::optional<Hash128> src = DerivedSource(name);
      if (!src.has_value() || !(*src == source)) continue;
      LORADB_RETURN_IF_ERROR(Unlink(dir / name));
      ++removed;
    }
  }
  return removed;
}

absl::StatusOr<DerivedShardSweep> CollectDerivedShards(const std::string& cache_dir,
                                                       const SourceReferencedFn& referenced) {
  DerivedShardSweep out;
  LORADB_ASSIGN_OR_RETURN(std::vector<std::filesystem::path> dirs, DegreeDirs(cache_dir));
  for (const std::filesystem::path& dir : dirs) {
    LORADB_ASSIGN_OR_RETURN(auto files, Files(dir));
    for (const auto& [name, size] : files) {
      if (const pid_t writer = TempWriter(name); writer != 0) {
        if (ProcessAlive(writer)) {
          ++out.temps_kept;
        } else {
          LORADB_RETURN_IF_ERROR(Unlink(dir / name));
          ++out.temps_removed;
        }
        continue;
      }
      std::optional<Hash128> src = DerivedSource(name);
      if (!src.has_value()) {
        ++out.ignored;
        continue;
      }
      LORADB_ASSIGN_OR_RETURN(bool live, referenced(*src));
      if (live) {
        ++out.kept;
        continue;
      }
      LORADB_RETURN_IF_ERROR(Unlink(dir / name));
      ++out.removed;
      out.removed_bytes += size;
    }
  }
  return out;
}

}  // namespace loradb::tiers
