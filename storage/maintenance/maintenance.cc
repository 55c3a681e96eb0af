#include "storage/maintenance/maintenance.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <functional>
#include <map>
#include <optional>
#include <set>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "storage/catalog/catalog.h"
#include "storage/formats/blob.h"
#include "storage/maintenance/rebuild.h"
#include "storage/store/adapter_blob.h"
#include "storage/store/store.h"
#include "storage/util/fault_injection.h"
#include "storage/util/file_util.h"
#include "storage/util/status_macros.h"
#include "storage/util/store_lock.h"

namespace loradb {
namespace {

using maint_internal::RebuildResult;
using maint_internal::RebuildSpec;

int64_t NowMicros() {
  return std::chrono::duration_cast<std::chrono::microseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

double NowSeconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

uint64_t FileBytes(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 ? static_cast<uint64_t>(st.st_size) : 0;
}

bool Exists(const std::string& path) {
  struct stat st;
  return ::lstat(path.c_str(), &st) == 0;
}

absl::Status Unlink(const std::string& path) {
  if (::unlink(path.c_str()) != 0 && errno != ENOENT) {
    return ErrnoToStatus(errno, absl::StrCat("unlink ", path));
  }
  return absl::OkStatus();
}

absl::Status RemoveTree(const std::string& path) {
  std::error_code ec;
  std::filesystem::remove_all(path, ec);
  if (ec) return ErrnoToStatus(ec.value(), absl::StrCat("remove ", path));
  return absl::OkStatus();
}

// The store's maintenance paths.
struct Paths {
  explicit Paths(const std::string& dir, const std::string& blob_root_option)
      : store(dir),
        catalog(dir + "/catalog"),
        data(dir + "/catalog/data.mdb"),
        prev(dir + "/catalog/prev.mdb"),
        prev_tmp(dir + "/catalog/prev.mdb.tmp"),
        work(dir + "/.maint"),
        work_store(dir + "/.maint/next"),
        work_env(dir + "/.maint/next/catalog"),
        blob_root(blob_root_option.empty() ? dir + "/blobs" : blob_root_option) {}
  std::string store, catalog, data, prev, prev_tmp, work, work_store, work_env, blob_root;
};

// Removes what a crashed earlier run left behind (its unfinished next generation and temp link).
absl::Status CleanLeftovers(const Paths& p) {
  if (Exists(p.work)) LORADB_RETURN_IF_ERROR(RemoveTree(p.work));
  LORADB_RETURN_IF_ERROR(Unlink(p.prev_tmp));
  return absl::OkStatus();
}

// The maintenance checks beyond Catalog::CheckIntegrity, over an open catalog.
absl::Status DeepCatalogChecks(const Catalog& cat, StoreVerifyReport* rep) {
  auto problem = [&](std::string s) {
    if (rep->problems.size() < 1000) rep->problems.push_back(std::move(s));
  };
  // Revision ids (ascending, as the scan returns them), live states, blob references and
  // parents, from one ordered scan. Flat containers: this runs over millions of revisions.
  std::vector<uint64_t> ids;
  absl::flat_hash_map<std::pair<uint64_t, uint64_t>, std::vector<uint64_t>> by_blob;
  std::vector<std::pair<uint64_t, uint64_t>> parents;  // (revision, parent)
  uint64_t after = 0;
  for (;;) {
    LORADB_ASSIGN_OR_RETURN(Page<RevisionRecord> page, cat.ListRevisions(after, 4096, true));
    for (const RevisionRecord& r : page.items) {
      ids.push_back(r.id);
      if (!r.blob.empty()) by_blob[{r.blob.hash.high, r.blob.hash.low}].push_back(r.id);
      if (r.parent != 0) parents.push_back({r.id, r.parent});
    }
    if (!page.next_after) break;
    after = *page.next_after;
  }
  auto exists = [&](uint64_t id) { return std::binary_search(ids.begin(), ids.end(), id); };
  const uint64_t high_water = ids.empty() ? 0 : ids.back();
  auto check_ref = [&](uint64_t id, const std::string& what) {
    if (id == 0 || exists(id)) return;
    if (id < high_water) {
      ++rep->pruned_references;
    } else {
      problem(absl::StrCat(what, " points at revision ", id, ", which never existed"));
    }
  };
  for (const auto& [rev, parent] : parents) {
    check_ref(parent, absl::StrCat("revision ", rev, "'s parent"));
  }
  // Alias logs: an unbroken chain (the alias's value is the last entry's `to`).
  LORADB_ASSIGN_OR_RETURN(std::vector<PolicyRecord> policies, cat.ListPolicies());
  for (const PolicyRecord& p : policies) {
    LORADB_ASSIGN_OR_RETURN(std::vector<AliasEntry> aliases, cat.ListAliases(p.id));
    for (const AliasEntry& a : aliases) {
      LORADB_ASSIGN_OR_RETURN(std::vector<AliasLogEntry> log, cat.AliasLog(p.id, a.alias));
      rep->alias_log_entries += log.size();
      const std::string name = absl::StrCat("alias '", p.name, ":", a.alias, "'");
      if (log.empty()) {
        problem(absl::StrCat(name, " has no log entry"));
        continue;
      }
      if (log.front().from_revision != 0 && !exists(log.front().from_revision) &&
          log.front().from_revision >= high_water) {
        problem(absl::StrCat(name, "'s first log entry starts from a revision that never existed"));
      }
      // The log's order is its entry numbers (1, 2, ... in commit order); its times are the
      // wall clock's and may go backwards (a stepped clock), so they are not checked.
      for (size_t i = 0; i < log.size(); ++i) {
        if (log[i].seq != i + 1) {
          problem(absl::StrCat(name, " log entry ", i + 1, " is numbered ", log[i].seq,
                               " (entries are numbered 1, 2, ... without gaps)"));
        }
        if (i > 0 && log[i].from_revision != log[i - 1].to_revision) {
          problem(absl::StrCat(name, " log entry ", i + 1, " moves from ", log[i].from_revision,
                               " but entry ", i, " moved it to ", log[i - 1].to_revision));
        }
        check_ref(log[i].to_revision, absl::StrCat(name, " log entry ", i + 1));
      }
    }
  }
  // The v2 revisions_by_blob index against the revision records.
  if (cat.schema_version() >= 2) {
    for (const auto& [hash, ids] : by_blob) {
      LORADB_ASSIGN_OR_RETURN(std::vector<uint64_t> indexed,
                              cat.ListRevisionsByBlob(Hash128{hash.first, hash.second}));
      if (indexed != ids) {
        problem(absl::StrCat("revisions_by_blob index for blob ",
                             Hash128{hash.first, hash.second}.Hex(), " lists ", indexed.size(),
                             " revisions, the records ", ids.size()));
      }
    }
  }
  return absl::OkStatus();
}

// Verifies the rebuilt catalog in `work_store` (blobs in `blob_root`): integrity, the deep
// checks, the counts the rebuild promised, and every referenced blob file present with its size.
absl::Status VerifyNewGeneration(const Paths& p, const RebuildResult& plan) {
  CatalogOptions copts;
  copts.create_if_missing = false;
  LORADB_ASSIGN_OR_RETURN(std::shared_ptr<Catalog> cat, Catalog::Open(p.work_store, copts));
  LORADB_ASSIGN_OR_RETURN(CatalogIntegrity integ, cat->CheckIntegrity());
  StoreVerifyReport rep;
  rep.problems = integ.problems;
  LORADB_RETURN_IF_ERROR(DeepCatalogChecks(*cat, &rep));
  auto expect = [&](absl::string_view what, uint64_t got, uint64_t want) {
    if (got != want) {
      rep.problems.push_back(absl::StrCat(what, ": ", got, " in the new catalog, expected ", want));
    }
  };
  expect("revisions", integ.revisions, plan.revisions_kept);
  expect("live revisions", integ.live_revisions, plan.live_revisions_kept);
  expect("policies", integ.policies, plan.policies);
  expect("aliases", integ.aliases, plan.aliases);
  expect("checkpoints", integ.checkpoints, plan.checkpoints);
  expect("blob records", integ.blobs.size(), plan.blob_records_kept);
  for (const BlobRecord& b : integ.blobs) {
    if (b.refcount == 0) continue;
    const std::string path = absl::StrCat(p.blob_root, "/", b.relpath);
    if (FileBytes(path) != b.bytes) {
      rep.problems.push_back(absl::StrCat("blob ", path, " is missing or not ", b.bytes, " bytes"));
    }
  }
  if (!rep.problems.empty()) {
    std::string msg = "the rebuilt catalog failed verification; the store is unchanged:";
    for (size_t i = 0; i < rep.problems.size() && i < 20; ++i) {
      absl::StrAppend(&msg, "\n  ", rep.problems[i]);
    }
    return absl::DataLossError(msg);
  }
  return absl::OkStatus();
}

struct SwapResult {
  std::string previous;  // kept prev.mdb, or empty
};

// Installs the verified `<work_env>/data.mdb` as the store's catalog: keeps the current file as
// prev.mdb (a hard link renamed into place) unless `drop_previous`, then one rename over
// catalog/data.mdb, fsyncing the directories around each step.
absl::StatusOr<SwapResult> SwapGeneration(const Paths& p, bool drop_previous) {
  SwapResult out;
  LORADB_RETURN_IF_ERROR(FaultPoint("maint.before_fsync_new_dir"));
  LORADB_RETURN_IF_ERROR(FsyncDirectory(p.work_env));
  LORADB_RETURN_IF_ERROR(FaultPoint("maint.after_fsync_new_dir"));
  if (!drop_previous) {
    if (::link(p.data.c_str(), p.prev_tmp.c_str()) != 0) {
      return ErrnoToStatus(errno, absl::StrCat("link ", p.data, " to ", p.prev_tmp));
    }
    LORADB_RETURN_IF_ERROR(FaultPoint("maint.before_rename_prev"));
    if (::rename(p.prev_tmp.c_str(), p.prev.c_str()) != 0) {
      return ErrnoToStatus(errno, absl::StrCat("rename ", p.prev_tmp, " to ", p.prev));
    }
    LORADB_RETURN_IF_ERROR(FaultPoint("maint.after_rename_prev"));
    LORADB_RETURN_IF_ERROR(FsyncDirectory(p.catalog));
    LORADB_RETURN_IF_ERROR(FaultPoint("maint.after_fsync_prev"));
    out.previous = p.prev;
  }
  // The commit point: one rename.
  LORADB_RETURN_IF_ERROR(FaultPoint("maint.before_swap_rename"));
  const std::string next = p.work_env + "/data.mdb";
  if (::rename(next.c_str(), p.data.c_str()) != 0) {
    return ErrnoToStatus(errno, absl::StrCat("rename ", next, " to ", p.data));
  }
  LORADB_RETURN_IF_ERROR(FaultPoint("maint.after_swap_rename"));
  LORADB_RETURN_IF_ERROR(FsyncDirectory(p.catalog));
  LORADB_RETURN_IF_ERROR(FaultPoint("maint.after_fsync_catalog_dir"));
  LORADB_RETURN_IF_ERROR(FsyncDirectory(p.store));
  LORADB_RETURN_IF_ERROR(FaultPoint("maint.after_fsync_parent"));
  if (drop_previous && Exists(p.prev)) {
    LORADB_RETURN_IF_ERROR(Unlink(p.prev));
    LORADB_RETURN_IF_ERROR(FsyncDirectory(p.catalog));
    LORADB_RETURN_IF_ERROR(FaultPoint("maint.after_drop_previous"));
  }
  return out;
}

// Deletes blob files under the blob root whose relative path is in neither keep set.
absl::Status CollectBlobFiles(const Paths& p, const std::set<std::string>& keep,
                              const std::set<std::string>& keep_for_previous, CompactReport* rep) {
  std::error_code ec;
  std::vector<std::pair<std::string, uint64_t>> doomed;
  if (!Exists(p.blob_root)) return absl::OkStatus();
  for (auto it = std::filesystem::recursive_directory_iterator(p.blob_root, ec);
       !ec && it != std::filesystem::recursive_directory_iterator(); it.increment(ec)) {
    if (!it->is_regular_file()) continue;
    const std::string full = it->path().string();
    const std::string rel = full.substr(p.blob_root.size() + 1);
    if (keep.count(rel)) continue;
    if (keep_for_previous.count(rel)) {
      ++rep->blob_files_kept_for_previous;
      continue;
    }
    doomed.push_back({full, it->file_size()});
  }
  if (ec) return ErrnoToStatus(ec.value(), absl::StrCat("walk ", p.blob_root));
  LORADB_RETURN_IF_ERROR(FaultPoint("maint.before_collect_blobs"));
  for (const auto& [path, bytes] : doomed) {
    LORADB_RETURN_IF_ERROR(FaultPoint("maint.collect_blob"));
    LORADB_RETURN_IF_ERROR(Unlink(path));
    ++rep->blob_files_deleted;
    rep->blob_bytes_deleted += bytes;
  }
  if (!doomed.empty()) LORADB_RETURN_IF_ERROR(FsyncDirectory(p.blob_root));
  return absl::OkStatus();
}

absl::Status RequireCatalog(const Paths& p) {
  if (!Exists(p.data)) {
    return absl::NotFoundError(absl::StrCat("no store at '", p.store, "' (no catalog/data.mdb)"));
  }
  return absl::OkStatus();
}

// Writes a blob file durably under the blob root (fan-out directories made durable first),
// unless a file of that size is already there.
absl::Status WriteBlobDurably(const Paths& p, const std::string& rel, const std::string& bytes) {
  const std::string path = absl::StrCat(p.blob_root, "/", rel);
  if (Exists(path) && FileBytes(path) == bytes.size()) return absl::OkStatus();
  const std::filesystem::path leaf = std::filesystem::path(path).parent_path();
  const bool had_leaf = Exists(leaf.string()), had_mid = Exists(leaf.parent_path().string());
  LORADB_RETURN_IF_ERROR(CreateDirectories(leaf.string()));
  if (!had_mid) LORADB_RETURN_IF_ERROR(FsyncDirectory(p.blob_root));
  if (!had_leaf) LORADB_RETURN_IF_ERROR(FsyncDirectory(leaf.parent_path().string()));
  return WriteFileAtomic(path, bytes);
}

// Finds the live revisions to re-layout, writes their new blobs and fills `rewrites`.
absl::Status PlanRepack(const Paths& p, const MigrateOptions& options,
                        std::map<uint64_t, maint_internal::RevisionRewrite>* rewrites,
                        MigrateReport* rep) {
  const bool pack = options.repack == Repack::kPack;
  const Layout from = pack ? Layout::kPlain : Layout::kPacked;
  CatalogOptions copts;
  copts.create_if_missing = false;
  LORADB_ASSIGN_OR_RETURN(std::shared_ptr<Catalog> cat, Catalog::Open(p.store, copts));
  // One new blob per old blob: revisions sharing content share the rewritten blob too.
  std::map<std::pair<uint64_t, uint64_t>, std::optional<maint_internal::RevisionRewrite>> done;
  uint64_t after = 0;
  for (;;) {
    LORADB_ASSIGN_OR_RETURN(Page<RevisionRecord> page, cat->ListRevisions(after, 1024));
    for (const RevisionRecord& r : page.items) {
      if (r.layout != from || r.blob.empty()) continue;
      auto key = std::make_pair(r.blob.hash.high, r.blob.hash.low);
      auto it = done.find(key);
      if (it == done.end()) {
        const std::string path = absl::StrCat(p.blob_root, "/", BlobRelPath(r.blob.hash));
        LORADB_ASSIGN_OR_RETURN(TensorSet tensors, ReadAdapterBlob(path, r.blob));
        LORADB_ASSIGN_OR_RETURN(MappedFile map, MappedFile::Open(path));
        LORADB_ASSIGN_OR_RETURN(uint64_t head, BlobHeaderEnd(map.bytes()));
        LORADB_ASSIGN_OR_RETURN(BlobLayout layout,
                                ParseBlobLayout(map.bytes().first(head), map.size()));
        LORADB_ASSIGN_OR_RETURN(EncodedBlob enc,
                                EncodeAdapterBlob(tensors.tensors(), layout.metadata, pack));
        std::optional<maint_internal::RevisionRewrite> rw;
        if (enc.layout != r.layout) {  // kPack: nothing stackable leaves it plain
          rw.emplace();
          rw->blob = BlobRef{enc.hash, enc.bytes.size(), r.blob.tensors};
          rw->layout = enc.layout;
          rw->relpath = BlobRelPath(enc.hash);
          ++rep->blobs_written;
          rep->rewritten_bytes_before += r.blob.bytes;
          rep->rewritten_bytes_after += enc.bytes.size();
          if (!options.dry_run) {
            LORADB_RETURN_IF_ERROR(FaultPoint("maint.repack_blob"));
            LORADB_RETURN_IF_ERROR(WriteBlobDurably(p, rw->relpath, enc.bytes));
          }
        }
        it = done.emplace(key, std::move(rw)).first;
      }
      if (it->second) {
        (*rewrites)[r.id] = *it->second;
        ++rep->revisions_rewritten;
      }
    }
    if (!page.next_after) break;
    after = *page.next_after;
  }
  return absl::OkStatus();
}

// The common end of compact and migrate, after the new generation was rebuilt into p.work:
// unless `dry_run`, verify it, swap it in, run `after_swap` (compact collects blob files), remove
// the work dir, and fill the report's timings (rebuild, verify, swap, total) from `t0`.
template <typename Report>
absl::Status FinishGeneration(const Paths& p, const RebuildResult& plan, bool dry_run,
                              bool drop_previous, double t0, Report* rep,
                              const std::function<absl::Status()>& after_swap = nullptr) {
  const double t1 = NowSeconds();
  rep->rebuild_seconds = t1 - t0;
  if (dry_run) {
    rep->seconds = NowSeconds() - t0;
    return absl::OkStatus();
  }
  absl::Status st = VerifyNewGeneration(p, plan);
  if (!st.ok()) {
    (void)RemoveTree(p.work);
    return st;
  }
  const double t2 = NowSeconds();
  rep->verify_seconds = t2 - t1;
  LORADB_ASSIGN_OR_RETURN(SwapResult swap, SwapGeneration(p, drop_previous));
  rep->previous_generation = swap.previous;
  rep->catalog_bytes_after = FileBytes(p.data);
  if (after_swap) LORADB_RETURN_IF_ERROR(after_swap());
  LORADB_RETURN_IF_ERROR(RemoveTree(p.work));
  LORADB_RETURN_IF_ERROR(FaultPoint("maint.done"));
  rep->seconds = NowSeconds() - t0;
  rep->swap_seconds = rep->seconds - (t2 - t0);
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<uint32_t> ReadStoreSchemaVersion(const std::string& dir) {
  return maint_internal::ReadEnvSchemaVersion(dir + "/catalog");
}

absl::StatusOr<CompactReport> CompactStore(const std::string& dir, const CompactOptions& options) {
  const double t0 = NowSeconds();
  const Paths p(dir, options.blob_root);
  LORADB_RETURN_IF_ERROR(RequireCatalog(p));
  LORADB_ASSIGN_OR_RETURN(StoreLock lock, StoreLock::Acquire(dir, StoreLock::Mode::kExclusive));
  LORADB_ASSIGN_OR_RETURN(uint32_t version, ReadStoreSchemaVersion(dir));
  if (version != kCatalogSchemaVersion) {
    return absl::FailedPreconditionError(absl::StrCat(
        "store '", dir, "' has schema version ", version, "; this loradb compacts version ",
        kCatalogSchemaVersion,
        (version < kCatalogSchemaVersion ? " (run `loradb migrate` first)" : " (upgrade loradb)")));
  }
  if (!options.dry_run) LORADB_RETURN_IF_ERROR(CleanLeftovers(p));

  CompactReport rep;
  rep.dry_run = options.dry_run;
  rep.catalog_bytes_before = FileBytes(p.data);
  RebuildSpec spec;
  spec.target_version = kCatalogSchemaVersion;
  spec.drop_deleted = true;
  spec.drop_unreferenced_blobs = true;
  spec.apply_retention = true;
  spec.retention = options.retention;
  spec.now_us = options.now_us != 0 ? options.now_us : NowMicros();
  spec.progress = options.progress;
  LORADB_ASSIGN_OR_RETURN(
      RebuildResult plan,
      maint_internal::Rebuild(p.catalog, options.dry_run ? "" : p.work_env, spec));
  rep.revisions_before = plan.revisions_before;
  rep.revisions_kept = plan.revisions_kept;
  rep.live_revisions_kept = plan.live_revisions_kept;
  rep.dropped_deleted = plan.dropped_deleted;
  rep.dropped_retention = plan.dropped_retention;
  rep.blob_records_before = plan.blob_records_before;
  rep.blob_records_kept = plan.blob_records_kept;
  LORADB_RETURN_IF_ERROR(FinishGeneration(
      p, plan, options.dry_run, options.drop_previous, t0, &rep, [&]() -> absl::Status {
        if (!options.collect_blob_files) return absl::OkStatus();
        const std::set<std::string> none;
        return CollectBlobFiles(p, plan.kept_blob_relpaths,
                                options.drop_previous ? none : plan.source_blob_relpaths, &rep);
      }));
  return rep;
}

absl::StatusOr<MigrateReport> MigrateStore(const std::string& dir, const MigrateOptions& options) {
  const double t0 = NowSeconds();
  const Paths p(dir, options.blob_root);
  LORADB_RETURN_IF_ERROR(RequireCatalog(p));
  LORADB_ASSIGN_OR_RETURN(StoreLock lock, StoreLock::Acquire(dir, StoreLock::Mode::kExclusive));
  MigrateReport rep;
  rep.dry_run = options.dry_run;
  LORADB_ASSIGN_OR_RETURN(rep.from_version, ReadStoreSchemaVersion(dir));
  rep.to_version = kCatalogSchemaVersion;
  rep.catalog_bytes_before = FileBytes(p.data);
  if (rep.from_version > kCatalogSchemaVersion) {
    return absl::FailedPreconditionError(
        absl::StrCat("store '", dir, "' has schema version ", rep.from_version,
                     ", newer than this loradb supports (", kCatalogSchemaVersion,
                     "); upgrade loradb instead of migrating"));
  }
  if (options.repack != Repack::kNone && rep.from_version != kCatalogSchemaVersion) {
    return absl::FailedPreconditionError(
        absl::StrCat("store '", dir, "' has schema version ", rep.from_version,
                     "; run `loradb migrate` first, then `loradb migrate --repack/--unpack`"));
  }
  if (rep.from_version == kCatalogSchemaVersion && options.repack == Repack::kNone) {
    rep.catalog_bytes_after = rep.catalog_bytes_before;
    rep.seconds = NowSeconds() - t0;
    return rep;
  }
  if (!options.dry_run) LORADB_RETURN_IF_ERROR(CleanLeftovers(p));
  RebuildSpec spec;
  spec.target_version = kCatalogSchemaVersion;
  spec.progress = options.progress;
  if (options.repack != Repack::kNone) {
    LORADB_RETURN_IF_ERROR(PlanRepack(p, options, &spec.rewrites, &rep));
    spec.drop_unreferenced_blobs = true;  // refcounts move to the new blobs
    rep.changes.push_back(
        absl::StrCat(options.repack == Repack::kPack ? "repack " : "unpack ",
                     rep.revisions_rewritten, " revisions into ", rep.blobs_written, " new blobs (",
                     rep.rewritten_bytes_before, " -> ", rep.rewritten_bytes_after, " bytes)"));
    if (options.dry_run || rep.revisions_rewritten == 0) {
      rep.seconds = NowSeconds() - t0;
      return rep;
    }
  }
  LORADB_ASSIGN_OR_RETURN(
      RebuildResult plan,
      maint_internal::Rebuild(p.catalog, options.dry_run ? "" : p.work_env, spec));
  rep.revisions = plan.revisions_before;
  rep.index_entries = plan.index_entries;
  if (rep.from_version < kCatalogSchemaVersion) {
    rep.changes.push_back(
        absl::StrCat("schema_version ", rep.from_version, " -> ", kCatalogSchemaVersion));
  }
  if (rep.from_version < 2) {
    rep.changes.push_back(absl::StrCat("build the revisions_by_blob index: ", plan.index_entries,
                                       " entries over ", plan.revisions_before, " revisions"));
  }
  if (rep.from_version < 3) {
    rep.changes.push_back(absl::StrCat(plan.policies,
                                       " policy records: next_seq becomes a lower bound (publishes "
                                       "no longer rewrite the policy record)"));
  }
  if (rep.from_version < 7) {
    rep.changes.push_back(absl::StrCat(
        plan.revisions_kept,
        " revision records: layout 4 (fixed fields in one struct with the usual dtypes and target "
        "modules as a code and bits, the id left to the key, the base left to the policy)"));
    rep.changes.push_back(absl::StrCat(plan.policies, " policy records: the id left to the key"));
    rep.changes.push_back(absl::StrCat("drop the aliases database: ", plan.aliases,
                                       " aliases, each equal to its log's last entry, are read "
                                       "from the log"));
  }
  if (rep.from_version < 5) {
    rep.changes.push_back(absl::StrCat(plan.policies,
                                       " policy names: keyed by length, then name (names that "
                                       "count up are appended)"));
  }
  LORADB_RETURN_IF_ERROR(
      FinishGeneration(p, plan, options.dry_run, options.drop_previous, t0, &rep));
  return rep;
}

absl::StatusOr<StoreVerifyReport> VerifyStore(const std::string& dir,
                                              const StoreVerifyOptions& options) {
  StoreVerifyReport rep;
  LORADB_ASSIGN_OR_RETURN(rep.schema_version, ReadStoreSchemaVersion(dir));
  if (rep.schema_version != kCatalogSchemaVersion) {
    rep.problems.push_back(absl::StrCat(
        "schema version ", rep.schema_version, " is not this build's ", kCatalogSchemaVersion,
        rep.schema_version < kCatalogSchemaVersion ? " (run `loradb migrate`)"
                                                   : " (upgrade loradb)"));
    return rep;
  }
  StoreOptions sopts;
  sopts.create_if_missing = false;
  sopts.blob_root = options.blob_root;
  LORADB_ASSIGN_OR_RETURN(std::unique_ptr<Store> store, Store::Open(dir, sopts));
  LORADB_ASSIGN_OR_RETURN(StoreVerifyReport checked, VerifyOpenStore(*store));
  checked.schema_version = rep.schema_version;
  return checked;
}

absl::StatusOr<StoreVerifyReport> VerifyOpenStore(const Store& store) {
  StoreVerifyReport rep;
  rep.schema_version = store.catalog().schema_version();
  LORADB_ASSIGN_OR_RETURN(VerifyReport base, store.Verify());
  rep.problems = base.problems;
  rep.reclaimable = base.reclaimable;
  rep.reclaimable_bytes = base.reclaimable_bytes;
  rep.blobs_checked = base.blobs_checked;
  rep.bytes_checked = base.bytes_checked;
  rep.policies = base.catalog.policies;
  rep.revisions = base.catalog.revisions;
  rep.live_revisions = base.catalog.live_revisions;
  rep.aliases = base.catalog.aliases;
  rep.checkpoints = base.catalog.checkpoints;
  LORADB_RETURN_IF_ERROR(DeepCatalogChecks(store.catalog(), &rep));
  return rep;
}

}  // namespace loradb
