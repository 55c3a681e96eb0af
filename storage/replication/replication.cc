#include "storage/replication/replication.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <system_error>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "storage/util/file_util.h"
#include "storage/util/json.h"
#include "storage/util/status_macros.h"

namespace loradb {
namespace {

constexpr char kGenPrefix[] = "gen-";
constexpr char kTmpPrefix[] = "tmp-";
constexpr char kEpochPrefix[] = "epoch-";

std::string GenDir(const std::string& root, uint64_t gen) {
  return absl::StrCat(root, "/", GenerationDirName(gen));
}

// Parses "gen-<digits>"; nullopt for any other name.
std::optional<uint64_t> ParseGenName(absl::string_view name) {
  if (!absl::ConsumePrefix(&name, kGenPrefix) || name.size() != 20) return std::nullopt;
  uint64_t gen = 0;
  if (!absl::SimpleAtoi(name, &gen) || gen == 0) return std::nullopt;
  return gen;
}

// Parses "epoch-<20 digits>"; nullopt for any other name.
std::optional<uint64_t> ParseEpochName(absl::string_view name) {
  if (!absl::ConsumePrefix(&name, kEpochPrefix) || name.size() != 20) return std::nullopt;
  uint64_t epoch = 0;
  if (!absl::SimpleAtoi(name, &epoch) || epoch == 0) return std::nullopt;
  return epoch;
}

std::string EpochFileName(uint64_t epoch) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "epoch-%020llu", static_cast<unsigned long long>(epoch));
  return buf;
}

// Names in `dir` (not . and ..).
absl::StatusOr<std::vector<std::string>> ListDir(const std::string& dir) {
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr) return ErrnoToStatus(errno, absl::StrCat("replica: list ", dir));
  std::vector<std::string> out;
  while (dirent* e = ::readdir(d)) {
    const std::string name = e->d_name;
    if (name != "." && name != "..") out.push_back(name);
  }
  ::closedir(d);
  return out;
}

absl::Status RemoveTree(const std::string& path) {
  std::error_code ec;
  std::filesystem::remove_all(path, ec);
  if (ec) return ErrnoToStatus(ec.value(), absl::StrCat("replica: remove ", path));
  return absl::OkStatus();
}

absl::StatusOr<Hash128> HashFile(const std::string& path, uint64_t* bytes) {
  LORADB_ASSIGN_OR_RETURN(MappedFile f, MappedFile::Open(path));
  *bytes = f.size();
  return Xxh3_128(f.data(), f.size());
}

int64_t NowMicros() {
  return std::chrono::duration_cast<std::chrono::microseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

}  // namespace

std::string ReplicaRootFor(const std::string& store_dir) { return store_dir + "/replica"; }

std::string GenerationDirName(uint64_t generation) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "gen-%020llu", static_cast<unsigned long long>(generation));
  return buf;
}

absl::StatusOr<GenerationManifest> ReadManifest(const std::string& replica_root,
                                                uint64_t generation) {
  const std::string path = GenDir(replica_root, generation) + "/MANIFEST.json";
  LORADB_ASSIGN_OR_RETURN(std::string text, ReadFileToString(path));
  absl::StatusOr<nlohmann::json> parsed = ParseJson(text, path);
  const nlohmann::json j = parsed.ok() ? *std::move(parsed) : nlohmann::json();
  if (!j.is_object() || !j.contains("generation") || !j["generation"].is_number_unsigned() ||
      !j.contains("store_id") || !j["store_id"].is_string() || !j.contains("txnid") ||
      !j["txnid"].is_number_unsigned() || !j.contains("data_bytes") ||
      !j["data_bytes"].is_number_unsigned() || !j.contains("data_xxh3_128") ||
      !j["data_xxh3_128"].is_string() || !j.contains("published_us") ||
      !j["published_us"].is_number_integer()) {
    return absl::DataLossError(absl::StrCat("replica: malformed manifest ", path));
  }
  GenerationManifest m;
  m.generation = j["generation"].get<uint64_t>();
  m.store_id = j["store_id"].get<std::string>();
  m.txnid = j["txnid"].get<uint64_t>();
  m.published_us = j["published_us"].get<int64_t>();
  m.data_bytes = j["data_bytes"].get<uint64_t>();
  LORADB_ASSIGN_OR_RETURN(m.data_hash, ParseHash128(j["data_xxh3_128"].get<std::string>()));
  if (j.contains("writer_epoch")) {  // absent in generations published before fencing
    if (!j["writer_epoch"].is_number_unsigned()) {
      return absl::DataLossError(absl::StrCat("replica: malformed writer_epoch in ", path));
    }
    m.epoch = j["writer_epoch"].get<uint64_t>();
  }
  if (m.generation != generation) {
    return absl::DataLossError(absl::StrCat("replica: manifest ", path, " names generation ",
                                            m.generation, ", expected ", generation));
  }
  return m;
}

absl::StatusOr<uint64_t> ReadCurrentGeneration(const std::string& replica_root) {
  auto text = ReadFileToString(replica_root + "/CURRENT");
  if (!text.ok()) {
    if (absl::IsNotFound(text.status())) {
      return absl::NotFoundError(
          absl::StrCat("replica: no generation published in '", replica_root, "' yet"));
    }
    return text.status();
  }
  auto gen = ParseGenName(absl::StripTrailingAsciiWhitespace(*text));
  if (!gen) {
    return absl::DataLossError(absl::StrCat("replica: bad CURRENT in '", replica_root, "'"));
  }
  return *gen;
}

absl::StatusOr<uint64_t> ReadWriterEpoch(const std::string& replica_root) {
  LORADB_ASSIGN_OR_RETURN(std::vector<std::string> names, ListDir(replica_root));
  uint64_t epoch = 0;
  for (const auto& name : names) {
    if (auto e = ParseEpochName(name)) epoch = std::max(epoch, *e);
  }
  return epoch;
}

// ---- publisher

ReplicaPublisher::ReplicaPublisher(std::shared_ptr<Catalog> catalog, std::string root,
                                   PublisherOptions options, int lock_fd)
    : catalog_(std::move(catalog)), root_(std::move(root)), options_(options), lock_fd_(lock_fd) {}

ReplicaPublisher::~ReplicaPublisher() {
  if (lock_fd_ >= 0) ::close(lock_fd_);  // releases the flock
}

absl::StatusOr<std::unique_ptr<ReplicaPublisher>> ReplicaPublisher::Open(
    std::shared_ptr<Catalog> catalog, const std::string& replica_root,
    const PublisherOptions& options) {
  if (catalog == nullptr) return absl::InvalidArgumentError("replica: no catalog");
  if (options.keep < 2) return absl::InvalidArgumentError("replica: keep must be at least 2");
  LORADB_RETURN_IF_ERROR(CreateDirectories(replica_root));
  const std::string lock_path = replica_root + "/LOCK";
  int fd = -1;
  if (options.use_flock) {
    fd = ::open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0) return ErrnoToStatus(errno, absl::StrCat("replica: open ", lock_path));
    if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
      const int err = errno;
      ::close(fd);
      if (err == EWOULDBLOCK) {
        return absl::FailedPreconditionError(absl::StrCat(
            "replica: another publisher holds ", lock_path, " (one writer per replica root)"));
      }
      return ErrnoToStatus(err, absl::StrCat("replica: flock ", lock_path));
    }
  }
  std::unique_ptr<ReplicaPublisher> p(
      new ReplicaPublisher(std::move(catalog), replica_root, options, fd));
  // A new writer epoch: the next epoch-N created with O_EXCL (a compare-and-set on the
  // directory); losing a race moves on to the next number.
  LORADB_ASSIGN_OR_RETURN(uint64_t epoch, ReadWriterEpoch(replica_root));
  for (;;) {
    ++epoch;
    const std::string path = replica_root + "/" + EpochFileName(epoch);
    const int efd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (efd >= 0) {
      const int rc = ::fsync(efd);
      ::close(efd);
      if (rc != 0) return ErrnoToStatus(errno, absl::StrCat("replica: fsync ", path));
      break;
    }
    if (errno != EEXIST) return ErrnoToStatus(errno, absl::StrCat("replica: create ", path));
  }
  LORADB_RETURN_IF_ERROR(FsyncDirectory(replica_root));
  p->epoch_ = epoch;
  LORADB_ASSIGN_OR_RETURN(std::vector<std::string> names, ListDir(replica_root));
  for (const auto& name : names) {
    if (absl::StartsWith(name, kTmpPrefix)) {
      LORADB_RETURN_IF_ERROR(RemoveTree(replica_root + "/" + name));
    } else if (auto gen = ParseGenName(name)) {
      p->last_gen_ = std::max(p->last_gen_, *gen);
    }
  }
  auto current = ReadCurrentGeneration(replica_root);
  if (current.ok()) p->last_gen_ = std::max(p->last_gen_, *current);
  return p;
}

absl::Status ReplicaPublisher::CheckNotFenced() const {
  LORADB_ASSIGN_OR_RETURN(uint64_t newest, ReadWriterEpoch(root_));
  if (newest > epoch_) {
    return absl::FailedPreconditionError(absl::StrCat(
        "replica: this writer was fenced: its epoch ", epoch_, " was superseded by writer epoch ",
        newest, " in ", root_, "; it must stop publishing (nothing was published)"));
  }
  return absl::OkStatus();
}

absl::StatusOr<GenerationManifest> ReplicaPublisher::Publish() {
  LORADB_RETURN_IF_ERROR(CheckNotFenced());
  // A newer writer may also have published: number after every generation on disk.
  LORADB_ASSIGN_OR_RETURN(std::vector<std::string> names, ListDir(root_));
  for (const auto& name : names) {
    if (auto g = ParseGenName(name)) last_gen_ = std::max(last_gen_, *g);
  }
  const uint64_t gen = last_gen_ + 1;
  const std::string tmp = absl::StrCat(root_, "/", kTmpPrefix, GenerationDirName(gen));
  auto build = [&]() -> absl::StatusOr<GenerationManifest> {
    LORADB_RETURN_IF_ERROR(RemoveTree(tmp));
    LORADB_RETURN_IF_ERROR(CreateDirectories(tmp + "/catalog"));
    GenerationManifest m;
    m.generation = gen;
    m.store_id = catalog_->store_id();
    LORADB_ASSIGN_OR_RETURN(m.txnid, catalog_->CopySnapshot(tmp + "/catalog"));
    LORADB_ASSIGN_OR_RETURN(m.data_hash, HashFile(tmp + "/catalog/data.mdb", &m.data_bytes));
    m.published_us = NowMicros();
    m.epoch = epoch_;
    nlohmann::json j = {{"generation", m.generation},
                        {"writer_epoch", m.epoch},
                        {"store_id", m.store_id},
                        {"txnid", m.txnid},
                        {"published_us", m.published_us},
                        {"data_bytes", m.data_bytes},
                        {"data_xxh3_128", m.data_hash.Hex()},
                        {"format", "lmdb-compact-copy"}};
    LORADB_RETURN_IF_ERROR(WriteFileAtomic(tmp + "/MANIFEST.json", j.dump(2) + "\n"));
    LORADB_RETURN_IF_ERROR(FsyncDirectory(tmp));
    const std::string final_dir = GenDir(root_, gen);
    if (::rename(tmp.c_str(), final_dir.c_str()) != 0) {
      return ErrnoToStatus(errno, absl::StrCat("replica: rename to ", final_dir));
    }
    LORADB_RETURN_IF_ERROR(FsyncDirectory(root_));
    return m;
  };
  auto m = build();
  if (!m.ok()) {
    (void)RemoveTree(tmp);
    return m.status();
  }
  // The generation is durable under its final name; CURRENT makes followers move to it. If the
  // process dies between the two, the next publisher numbers after it and followers never
  // needed it.
  last_gen_ = gen;
  // Fenced while building? Then the generation was never named: remove it, change nothing.
  if (absl::Status fenced = CheckNotFenced(); !fenced.ok()) {
    (void)RemoveTree(GenDir(root_, gen));
    return fenced;
  }
  last_txnid_ = m->txnid;
  LORADB_RETURN_IF_ERROR(WriteFileAtomic(root_ + "/CURRENT", GenerationDirName(gen) + "\n"));
  LORADB_RETURN_IF_ERROR(Prune());
  return m;
}

absl::StatusOr<std::optional<GenerationManifest>> ReplicaPublisher::PublishIfChanged() {
  if (last_txnid_) {
    LORADB_ASSIGN_OR_RETURN(const uint64_t now, catalog_->LastTxnId());
    if (now <= *last_txnid_) return std::optional<GenerationManifest>();
  }
  LORADB_ASSIGN_OR_RETURN(GenerationManifest m, Publish());
  return std::optional<GenerationManifest>(std::move(m));
}

absl::Status ReplicaPublisher::Prune() {
  LORADB_ASSIGN_OR_RETURN(std::vector<std::string> names, ListDir(root_));
  for (const auto& name : names) {
    auto gen = ParseGenName(name);
    if (gen && *gen + options_.keep <= last_gen_) {
      LORADB_RETURN_IF_ERROR(RemoveTree(root_ + "/" + name));
    }
  }
  return absl::OkStatus();
}

// ---- follower

ReplicaFollower::ReplicaFollower(std::string root, std::string blob_root)
    : root_(std::move(root)), blob_root_(std::move(blob_root)) {}

absl::StatusOr<std::unique_ptr<ReplicaFollower>> ReplicaFollower::Open(
    const std::string& replica_root, const FollowerOptions& options) {
  std::string blob_root = options.blob_root;
  if (blob_root.empty()) blob_root = replica_root + "/../blobs";
  std::unique_ptr<ReplicaFollower> f(new ReplicaFollower(replica_root, blob_root));
  // A generation may be pruned between reading CURRENT and opening it: retry with the new one.
  absl::Status last = absl::OkStatus();
  for (int attempt = 0; attempt < 8; ++attempt) {
    LORADB_ASSIGN_OR_RETURN(const uint64_t gen, ReadCurrentGeneration(replica_root));
    GenerationManifest m;
    auto store = f->OpenGeneration(gen, &m);
    if (store.ok()) {
      MutexLock lock(&f->mu_);
      f->store_ = std::move(*store);
      f->manifest_ = std::move(m);
      return f;
    }
    last = store.status();
    if (!absl::IsNotFound(last)) return last;
  }
  return last;
}

absl::StatusOr<std::shared_ptr<Store>> ReplicaFollower::OpenGeneration(
    uint64_t gen, GenerationManifest* manifest) const {
  LORADB_ASSIGN_OR_RETURN(GenerationManifest m, ReadManifest(root_, gen));
  {
    MutexLock lock(&mu_);
    if (store_ != nullptr && m.store_id != manifest_.store_id) {
      return absl::FailedPreconditionError(
          absl::StrCat("replica: generation ", gen, " belongs to store ", m.store_id,
                       ", this follower serves store ", manifest_.store_id));
    }
    if (store_ != nullptr && m.epoch < manifest_.epoch) {
      return absl::FailedPreconditionError(
          absl::StrCat("replica: generation ", gen, " was published by fenced writer epoch ",
                       m.epoch, "; this follower already serves writer epoch ", manifest_.epoch,
                       " (generation ", manifest_.generation, ")"));
    }
  }
  const std::string dir = GenDir(root_, gen);
  uint64_t bytes = 0;
  LORADB_ASSIGN_OR_RETURN(Hash128 hash, HashFile(dir + "/catalog/data.mdb", &bytes));
  if (bytes != m.data_bytes || !(hash == m.data_hash)) {
    return absl::DataLossError(absl::StrCat("replica: generation ", gen,
                                            " does not match its manifest (size or xxh3-128)"));
  }
  StoreOptions so;
  so.create_if_missing = false;
  so.blob_root = blob_root_;
  so.catalog.read_only = true;
  so.catalog.no_lock = true;
  LORADB_ASSIGN_OR_RETURN(std::unique_ptr<Store> store, Store::Open(dir, so));
  if (store->catalog().store_id() != m.store_id) {
    return absl::DataLossError(absl::StrCat("replica: generation ", gen,
                                            " holds a catalog of another store than its manifest"));
  }
  *manifest = std::move(m);
  return std::shared_ptr<Store>(std::move(store));
}

absl::StatusOr<bool> ReplicaFollower::Refresh() {
  MutexLock refresh_lock(&refresh_mu_);
  absl::Status last = absl::OkStatus();
  for (int attempt = 0; attempt < 8; ++attempt) {
    LORADB_ASSIGN_OR_RETURN(const uint64_t gen, ReadCurrentGeneration(root_));
    {
      MutexLock lock(&mu_);
      if (gen <= manifest_.generation) return false;
    }
    GenerationManifest m;
    auto store = OpenGeneration(gen, &m);
    if (store.ok()) {
      std::shared_ptr<Store> old;
      {
        MutexLock lock(&mu_);
        old = std::move(store_);
        store_ = std::move(*store);
        manifest_ = std::move(m);
      }
      return true;  // `old` closes here unless a reader still holds it
    }
    last = store.status();
    if (!absl::IsNotFound(last)) return last;
  }
  return last;
}

std::shared_ptr<Store> ReplicaFollower::store() const {
  MutexLock lock(&mu_);
  return store_;
}

GenerationManifest ReplicaFollower::manifest() const {
  MutexLock lock(&mu_);
  return manifest_;
}

}  // namespace loradb
