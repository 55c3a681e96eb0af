#include "storage/maintenance/rebuild.h"

#include <fcntl.h>
#include <lmdb.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <map>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "storage/catalog/codec.h"
#include "storage/catalog/key_encoding.h"
#include "storage/util/fault_injection.h"
#include "storage/util/file_util.h"
#include "storage/util/status_macros.h"

namespace loradb::maint_internal {
namespace {

namespace codec = catalog_codec;

absl::Status Lmdb(int rc, absl::string_view what) {
  const std::string msg = absl::StrCat("catalog rebuild: ", what, ": ", mdb_strerror(rc));
  if (rc == MDB_NOTFOUND) return absl::NotFoundError(msg);
  if (rc == MDB_MAP_FULL || rc == ENOSPC) return absl::ResourceExhaustedError(msg);
  if (rc == MDB_CORRUPTED || rc == MDB_PAGE_NOTFOUND || rc == MDB_INVALID) {
    return absl::DataLossError(msg);
  }
  if (rc > 0) return ErrnoToStatus(rc, absl::StrCat("catalog rebuild: ", what));
  return absl::InternalError(msg);
}

using catalog_keys::GetBE64;
using catalog_keys::PutBE64;

std::string BE64(uint64_t v) {
  std::string s(8, '\0');
  PutBE64(reinterpret_cast<uint8_t*>(s.data()), v);
  return s;
}

std::string BE128(uint64_t a, uint64_t b) { return BE64(a) + BE64(b); }

MDB_val Val(const std::string& s) { return {s.size(), const_cast<char*>(s.data())}; }
codec::Bytes Bytes(const MDB_val& v) { return {static_cast<const uint8_t*>(v.mv_data), v.mv_size}; }

// The revision record layout a store of schema `version` holds.
int RevisionLayoutOf(uint32_t version) {
  return version >= 7 ? 4 : version >= 6 ? 3 : version >= 4 ? 2 : 1;
}

// The named databases of each schema version, in a fixed order: a store of version v has those
// with since <= v < until.
struct DbSpec {
  const char* name;
  unsigned flags;
  uint32_t since;
  uint32_t until = UINT32_MAX;
  bool in(uint32_t version) const { return since <= version && version < until; }
};
constexpr DbSpec kDbs[] = {
    {"meta", 0, 1},
    {"bases", 0, 1},
    {"policies", 0, 1},
    {"policy_by_id", 0, 1},
    {"revisions", 0, 1},
    {"policy_revisions", MDB_DUPSORT | MDB_DUPFIXED, 1},
    {"aliases", 0, 1, 7},  // v7: an alias's value is its last alias_log entry's `to`
    {"alias_log", 0, 1},
    {"checkpoints", 0, 1},
    {"policy_checkpoints", MDB_DUPSORT | MDB_DUPFIXED, 1},
    {"blobs", 0, 1},
    {"revisions_by_blob", MDB_DUPSORT | MDB_DUPFIXED, 2},
};
constexpr size_t kNumDbs = sizeof(kDbs) / sizeof(kDbs[0]);
enum DbIndex : size_t {
  kMeta,
  kBases,
  kPolicies,
  kPolicyById,
  kRevisions,
  kPolicyRevisions,
  kAliases,
  kAliasLog,
  kCheckpoints,
  kPolicyCheckpoints,
  kBlobs,
  kRevisionsByBlob,
};

// An LMDB environment owned for the length of a rebuild.
class Env {
 public:
  Env() = default;
  ~Env() {
    if (env_ != nullptr) mdb_env_close(env_);
  }
  Env(const Env&) = delete;
  Env& operator=(const Env&) = delete;

  absl::Status Open(const std::string& dir, unsigned flags, uint64_t map_bytes) {
    int rc = mdb_env_create(&env_);
    if (rc != 0) return Lmdb(rc, "env create");
    mdb_env_set_maxdbs(env_, 16);
    rc = mdb_env_set_mapsize(env_, static_cast<size_t>(map_bytes));
    if (rc != 0) return Lmdb(rc, "set map size");
    rc = mdb_env_open(env_, dir.c_str(), flags | MDB_NOTLS, 0644);
    if (rc != 0) return Lmdb(rc, absl::StrCat("open ", dir));
    return absl::OkStatus();
  }
  MDB_env* get() const { return env_; }
  void Close() {
    if (env_ != nullptr) mdb_env_close(env_);
    env_ = nullptr;
  }

 private:
  MDB_env* env_ = nullptr;
};

class Txn {
 public:
  Txn() = default;
  ~Txn() { Abort(); }
  Txn(const Txn&) = delete;
  Txn& operator=(const Txn&) = delete;
  absl::Status Begin(MDB_env* env, unsigned flags) {
    int rc = mdb_txn_begin(env, nullptr, flags, &txn_);
    if (rc != 0) return Lmdb(rc, "begin transaction");
    return absl::OkStatus();
  }
  absl::Status Commit() {
    int rc = mdb_txn_commit(txn_);
    txn_ = nullptr;
    if (rc != 0) return Lmdb(rc, "commit");
    return absl::OkStatus();
  }
  void Abort() {
    if (txn_ != nullptr) mdb_txn_abort(txn_);
    txn_ = nullptr;
  }
  MDB_txn* get() const { return txn_; }

 private:
  MDB_txn* txn_ = nullptr;
};

class Cursor {
 public:
  Cursor(MDB_txn* txn, MDB_dbi dbi) { rc_ = mdb_cursor_open(txn, dbi, &c_); }
  ~Cursor() {
    if (c_ != nullptr) mdb_cursor_close(c_);
  }
  Cursor(const Cursor&) = delete;
  Cursor& operator=(const Cursor&) = delete;
  absl::Status status() const { return rc_ == 0 ? absl::OkStatus() : Lmdb(rc_, "cursor"); }
  int Get(MDB_val* k, MDB_val* v, MDB_cursor_op op) { return mdb_cursor_get(c_, k, v, op); }

 private:
  MDB_cursor* c_ = nullptr;
  int rc_ = 0;
};

uint64_t FileBytes(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 ? static_cast<uint64_t>(st.st_size) : 0;
}

absl::Status FsyncFile(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return ErrnoToStatus(errno, absl::StrCat("open ", path));
  const int rc = ::fsync(fd);
  const int err = errno;
  ::close(fd);
  if (rc != 0) return ErrnoToStatus(err, absl::StrCat("fsync ", path));
  return absl::OkStatus();
}

// Writes key-ordered data into a fresh environment, committing every `batch` puts.
class Appender {
 public:
  Appender(MDB_env* env, uint32_t version, size_t batch) : env_(env), batch_(batch) {
    for (size_t i = 0; i < kNumDbs; ++i) wanted_[i] = kDbs[i].in(version);
  }

  absl::Status Start() {
    LORADB_RETURN_IF_ERROR(txn_.Begin(env_, 0));
    for (size_t i = 0; i < kNumDbs; ++i) {
      if (!wanted_[i]) continue;
      int rc = mdb_dbi_open(txn_.get(), kDbs[i].name, kDbs[i].flags | MDB_CREATE, &dbi_[i]);
      if (rc != 0) return Lmdb(rc, absl::StrCat("create database ", kDbs[i].name));
    }
    return absl::OkStatus();
  }

  // Appends (key, value) to database `db`; keys must arrive in memcmp order (duplicates of a
  // DUPSORT database in value order).
  absl::Status Append(size_t db, const MDB_val& key, const MDB_val& value) {
    unsigned flags = MDB_APPEND;
    if (kDbs[db].flags & MDB_DUPSORT) {
      const std::string k(static_cast<const char*>(key.mv_data), key.mv_size);
      if (have_last_[db] && last_key_[db] == k) flags = MDB_APPENDDUP;
      last_key_[db] = k;
      have_last_[db] = true;
    }
    MDB_val kk = key, vv = value;
    int rc = mdb_put(txn_.get(), dbi_[db], &kk, &vv, flags);
    if (rc != 0) return Lmdb(rc, absl::StrCat("append to ", kDbs[db].name));
    if (++pending_ >= batch_) LORADB_RETURN_IF_ERROR(CommitBatch());
    return absl::OkStatus();
  }

  absl::Status CommitBatch() {
    LORADB_RETURN_IF_ERROR(FaultPoint("maint.write_batch"));
    LORADB_RETURN_IF_ERROR(txn_.Commit());
    pending_ = 0;
    return txn_.Begin(env_, 0);
  }

  absl::Status Finish() {
    LORADB_RETURN_IF_ERROR(FaultPoint("maint.write_batch"));
    return txn_.Commit();
  }

 private:
  MDB_env* env_;
  size_t batch_;
  Txn txn_;
  std::array<bool, kNumDbs> wanted_{};
  std::array<MDB_dbi, kNumDbs> dbi_{};
  std::array<std::string, kNumDbs> last_key_;
  std::array<bool, kNumDbs> have_last_{};
  size_t pending_ = 0;
};

struct RevInfo {
  uint64_t id = 0;
  uint64_t policy_id = 0;
  uint64_t seq = 0;
  Hash128 blob;
  bool has_blob = false;
  bool live = false;
  bool keep = true;
};

struct HashKey {
  uint64_t high, low;
  bool operator==(const HashKey&) const = default;
  template <typename H>
  friend H AbslHashValue(H h, const HashKey& k) {
    return H::combine(std::move(h), k.high, k.low);
  }
};

void Report(const RebuildSpec& spec, absl::string_view phase, uint64_t done, uint64_t total) {
  if (spec.progress) spec.progress(phase, done, total);
}

// Reads every alias's value from the source's alias log (the `to` of its last entry) into
// `out->alias_values`. A store older than v7 also holds each value in `aliases`, which a v7
// rebuild drops: every alias there must equal its log's value and every logged alias must be
// there, else FailedPrecondition naming the alias (nothing is written).
absl::Status CheckAliases(MDB_txn* txn, const std::array<MDB_dbi, kNumDbs>& dbi,
                          uint32_t source_version, uint32_t target_version,
                          const absl::flat_hash_map<uint64_t, PolicyRecord>& policies,
                          RebuildResult* out) {
  {
    Cursor c(txn, dbi[kAliasLog]);
    LORADB_RETURN_IF_ERROR(c.status());
    MDB_val k, v;
    int rc;
    // Key order puts an alias's entries together, its last entry last.
    for (rc = c.Get(&k, &v, MDB_FIRST); rc == 0; rc = c.Get(&k, &v, MDB_NEXT)) {
      const auto* key = static_cast<const uint8_t*>(k.mv_data);
      if (!catalog_keys::IsAliasLogKey(k.mv_data, k.mv_size)) {
        return absl::DataLossError("catalog: alias log key does not hold its alias's length");
      }
      LORADB_ASSIGN_OR_RETURN(AliasLogEntry e, codec::DecodeAliasLogEntry(Bytes(v)));
      out->alias_values[std::string(reinterpret_cast<const char*>(key), k.mv_size - 8)] =
          e.to_revision;
    }
    if (rc != MDB_NOTFOUND) return Lmdb(rc, "scan alias_log");
  }
  if (!kDbs[kAliases].in(source_version) || kDbs[kAliases].in(target_version)) {
    return absl::OkStatus();
  }
  auto name = [&](uint64_t policy_id, absl::string_view alias) {
    auto it = policies.find(policy_id);
    return absl::StrCat(
        "'", it == policies.end() ? absl::StrCat("policy id ", policy_id) : it->second.name, ":",
        alias, "'");
  };
  const absl::string_view refuse =
      "; the store is left as it is (v7 keeps an alias's value only as its log's last entry)";
  Cursor c(txn, dbi[kAliases]);
  LORADB_RETURN_IF_ERROR(c.status());
  MDB_val k, v;
  int rc;
  uint64_t matched = 0;
  for (rc = c.Get(&k, &v, MDB_FIRST); rc == 0; rc = c.Get(&k, &v, MDB_NEXT)) {
    if (k.mv_size < 9 || k.mv_size > 8 + 255 || v.mv_size != 8) {
      return absl::DataLossError("catalog: malformed alias entry");
    }
    const uint64_t pid = GetBE64(k.mv_data);
    const absl::string_view alias(static_cast<const char*>(k.mv_data) + 8, k.mv_size - 8);
    std::string prefix = BE64(pid);
    prefix.push_back(static_cast<char>(alias.size()));
    prefix.append(alias.data(), alias.size());
    const uint64_t value = GetBE64(v.mv_data);
    auto it = out->alias_values.find(prefix);
    if (it == out->alias_values.end()) {
      return absl::FailedPreconditionError(absl::StrCat("cannot migrate: alias ", name(pid, alias),
                                                        " points at revision ", value,
                                                        " but has no log entry", refuse));
    }
    if (it->second != value) {
      return absl::FailedPreconditionError(
          absl::StrCat("cannot migrate: alias ", name(pid, alias), " points at revision ", value,
                       " but its log's last entry moved it to ", it->second, refuse));
    }
    ++matched;
  }
  if (rc != MDB_NOTFOUND) return Lmdb(rc, "scan aliases");
  if (matched != out->alias_values.size()) {
    for (const auto& [prefix, to] : out->alias_values) {
      const uint64_t pid = GetBE64(prefix.data());
      const absl::string_view alias(prefix.data() + 9, prefix.size() - 9);
      std::string key = BE64(pid);
      key.append(alias.data(), alias.size());
      MDB_val kk = Val(key), vv;
      if (mdb_get(txn, dbi[kAliases], &kk, &vv) == MDB_NOTFOUND) {
        return absl::FailedPreconditionError(
            absl::StrCat("cannot migrate: alias ", name(pid, alias), " has a log (last moved to ",
                         to, ") but no value", refuse));
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<uint32_t> ReadEnvSchemaVersion(const std::string& env_dir) {
  struct stat st;
  if (::stat((env_dir + "/data.mdb").c_str(), &st) != 0) {
    return absl::NotFoundError(absl::StrCat("no catalog in '", env_dir, "'"));
  }
  Env env;
  LORADB_RETURN_IF_ERROR(env.Open(env_dir, MDB_RDONLY, 0));
  Txn txn;
  LORADB_RETURN_IF_ERROR(txn.Begin(env.get(), MDB_RDONLY));
  MDB_dbi meta;
  int rc = mdb_dbi_open(txn.get(), "meta", 0, &meta);
  if (rc != 0) return Lmdb(rc, "open database meta");
  std::string key = "schema_version";
  MDB_val k = Val(key), v;
  rc = mdb_get(txn.get(), meta, &k, &v);
  if (rc != 0) return Lmdb(rc, "read schema_version");
  if (v.mv_size != 8) return absl::DataLossError("catalog: bad schema_version entry");
  return static_cast<uint32_t>(GetBE64(v.mv_data));
}

absl::StatusOr<RebuildResult> Rebuild(const std::string& src_env_dir,
                                      const std::string& dst_env_dir, const RebuildSpec& spec) {
  RebuildResult out;
  LORADB_ASSIGN_OR_RETURN(out.source_version, ReadEnvSchemaVersion(src_env_dir));
  if (out.source_version > kCatalogSchemaVersion || spec.target_version > kCatalogSchemaVersion) {
    return absl::FailedPreconditionError(absl::StrCat(
        "catalog has schema version ", out.source_version, ", newer than this build supports (",
        kCatalogSchemaVersion, "); upgrade loradb"));
  }
  if (spec.target_version < out.source_version) {
    return absl::FailedPreconditionError("catalog rebuild cannot move a store backwards");
  }

  Env src;
  LORADB_RETURN_IF_ERROR(src.Open(src_env_dir, MDB_RDONLY, 0));
  Txn rtxn;
  LORADB_RETURN_IF_ERROR(rtxn.Begin(src.get(), MDB_RDONLY));
  std::array<MDB_dbi, kNumDbs> sdbi{};
  for (size_t i = 0; i < kNumDbs; ++i) {
    if (!kDbs[i].in(out.source_version)) continue;
    int rc = mdb_dbi_open(rtxn.get(), kDbs[i].name, kDbs[i].flags, &sdbi[i]);
    if (rc != 0) return Lmdb(rc, absl::StrCat("open database ", kDbs[i].name));
  }
  MDB_stat rev_stat;
  mdb_stat(rtxn.get(), sdbi[kRevisions], &rev_stat);
  const uint64_t total_revisions = rev_stat.ms_entries;

  // ---- plan: the policies (v7 revision records leave their base to them)...
  absl::flat_hash_map<uint64_t, PolicyRecord> policies;
  {
    Cursor c(rtxn.get(), sdbi[kPolicyById]);
    LORADB_RETURN_IF_ERROR(c.status());
    MDB_val k, v;
    int rc;
    for (rc = c.Get(&k, &v, MDB_FIRST); rc == 0; rc = c.Get(&k, &v, MDB_NEXT)) {
      if (k.mv_size != 8) return absl::DataLossError("catalog: policy key is not 8 bytes");
      LORADB_ASSIGN_OR_RETURN(PolicyRecord p, codec::DecodePolicy(Bytes(v), GetBE64(k.mv_data)));
      policies.emplace(p.id, std::move(p));
    }
    if (rc != MDB_NOTFOUND) return Lmdb(rc, "scan policy_by_id");
  }
  auto policy_base = [&](uint64_t policy_id) -> absl::StatusOr<std::string> {
    auto it = policies.find(policy_id);
    if (it == policies.end()) {
      return absl::DataLossError(absl::StrCat("catalog: a revision leaves its base to policy id ",
                                              policy_id, ", which has no record"));
    }
    return it->second.base;
  };
  LORADB_RETURN_IF_ERROR(
      CheckAliases(rtxn.get(), sdbi, out.source_version, spec.target_version, policies, &out));

  // ... which revisions stay, and the blob references they (and checkpoints) hold.
  std::vector<RevInfo> revs;
  revs.reserve(total_revisions);
  {
    Cursor c(rtxn.get(), sdbi[kRevisions]);
    LORADB_RETURN_IF_ERROR(c.status());
    MDB_val k, v;
    int rc;
    for (rc = c.Get(&k, &v, MDB_FIRST); rc == 0; rc = c.Get(&k, &v, MDB_NEXT)) {
      LORADB_ASSIGN_OR_RETURN(RevisionRecord r,
                              codec::DecodeRevision(Bytes(v), GetBE64(k.mv_data), policy_base));
      RevInfo ri;
      ri.id = GetBE64(k.mv_data);
      ri.policy_id = r.policy_id;
      ri.seq = r.seq;
      auto rw = spec.rewrites.find(ri.id);
      if (rw != spec.rewrites.end() && r.state == RevisionState::kLive) r.blob = rw->second.blob;
      ri.blob = r.blob.hash;
      ri.has_blob = !r.blob.empty();
      ri.live = r.state == RevisionState::kLive;
      revs.push_back(ri);
      if ((revs.size() & 0xffff) == 0) Report(spec, "scan", revs.size(), total_revisions);
    }
    if (rc != MDB_NOTFOUND) return Lmdb(rc, "scan revisions");
  }
  out.revisions_before = revs.size();
  Report(spec, "scan", revs.size(), total_revisions);

  absl::flat_hash_set<HashKey> checkpoint_blobs;
  absl::flat_hash_map<HashKey, uint64_t> refs;  // references held after the rebuild
  {
    Cursor c(rtxn.get(), sdbi[kCheckpoints]);
    LORADB_RETURN_IF_ERROR(c.status());
    MDB_val k, v;
    for (int rc = c.Get(&k, &v, MDB_FIRST); rc == 0; rc = c.Get(&k, &v, MDB_NEXT)) {
      LORADB_ASSIGN_OR_RETURN(CheckpointRecord ck, codec::DecodeCheckpoint(Bytes(v)));
      ++out.checkpoints;
      for (const BlobRef* b : {&ck.master, &ck.optimizer, &ck.gradients, &ck.rollout}) {
        if (b->empty()) continue;
        checkpoint_blobs.insert({b->hash.high, b->hash.low});
        ++refs[{b->hash.high, b->hash.low}];
      }
    }
  }

  if (spec.drop_deleted) {
    for (size_t i = 0; i + 1 < revs.size(); ++i) {  // the last id stays: ids are never reused
      if (!revs[i].live) revs[i].keep = false;
    }
  }
  if (spec.apply_retention && spec.retention.keep_last > 0) {
    // Every alias's value (the `to` of its last log entry) stays.
    absl::flat_hash_set<uint64_t> protected_ids;
    for (const auto& [prefix, to] : out.alias_values) protected_ids.insert(to);
    {
      // The window starts at an alias's first entry (in entry-number order, which is commit
      // order) whose time falls inside it; every later entry of that alias is inside too, so a
      // clock that stepped backwards cannot punch holes into the protected history.
      const int64_t window = spec.retention.alias_history_window_us;
      Cursor c(rtxn.get(), sdbi[kAliasLog]);
      LORADB_RETURN_IF_ERROR(c.status());
      MDB_val k, v;
      std::string alias_prefix;  // the key without its entry number: one alias's log
      bool inside = false;
      for (int rc = c.Get(&k, &v, MDB_FIRST); rc == 0; rc = c.Get(&k, &v, MDB_NEXT)) {
        if (k.mv_size < 8) return absl::DataLossError("catalog: alias log key is too short");
        const absl::string_view prefix(static_cast<const char*>(k.mv_data), k.mv_size - 8);
        if (prefix != alias_prefix) {
          alias_prefix = std::string(prefix);
          inside = false;
        }
        LORADB_ASSIGN_OR_RETURN(AliasLogEntry e, codec::DecodeAliasLogEntry(Bytes(v)));
        inside = inside || window < 0 || e.time_us >= spec.now_us - window;
        if (inside) {
          protected_ids.insert(e.from_revision);
          protected_ids.insert(e.to_revision);
        }
      }
    }
    // Per policy, newest first: the first keep_last live revisions stay; older ones only when
    // protected.
    std::map<uint64_t, std::vector<size_t>> by_policy;
    for (size_t i = 0; i < revs.size(); ++i) {
      if (revs[i].live) by_policy[revs[i].policy_id].push_back(i);
    }
    for (auto& [pid, idx] : by_policy) {
      std::sort(idx.begin(), idx.end(),
                [&](size_t a, size_t b) { return revs[a].seq > revs[b].seq; });
      for (size_t n = spec.retention.keep_last; n < idx.size(); ++n) {
        RevInfo& r = revs[idx[n]];
        if (protected_ids.count(r.id)) continue;
        if (r.has_blob && checkpoint_blobs.count({r.blob.high, r.blob.low})) continue;
        r.keep = false;
        ++out.dropped_retention;
      }
    }
  }
  for (const RevInfo& r : revs) {
    if (!r.keep) {
      if (!r.live) ++out.dropped_deleted;
      continue;
    }
    ++out.revisions_kept;
    if (r.live) {
      ++out.live_revisions_kept;
      if (r.has_blob) ++refs[{r.blob.high, r.blob.low}];
    }
  }

  // Blob records: the source's referenced ones, and the rebuilt refcounts.
  std::map<std::string, std::string> blob_rows;  // key -> re-encoded value, in key order
  {
    Cursor c(rtxn.get(), sdbi[kBlobs]);
    LORADB_RETURN_IF_ERROR(c.status());
    MDB_val k, v;
    for (int rc = c.Get(&k, &v, MDB_FIRST); rc == 0; rc = c.Get(&k, &v, MDB_NEXT)) {
      if (k.mv_size != 16) return absl::DataLossError("catalog: blob key is not 16 bytes");
      LORADB_ASSIGN_OR_RETURN(BlobRecord b, codec::DecodeBlob(Bytes(v)));
      ++out.blob_records_before;
      if (b.refcount > 0) out.source_blob_relpaths.insert(b.relpath);
      const HashKey hk{GetBE64(k.mv_data), GetBE64(static_cast<const uint8_t*>(k.mv_data) + 8)};
      auto it = refs.find(hk);
      const uint64_t count = it == refs.end() ? 0 : it->second;
      if (count == 0 && spec.drop_unreferenced_blobs) continue;
      if (spec.drop_unreferenced_blobs) b.refcount = count;
      if (b.refcount > 0) out.kept_blob_relpaths.insert(b.relpath);
      blob_rows.emplace(std::string(static_cast<const char*>(k.mv_data), 16), codec::EncodeBlob(b));
    }
  }
  // Records for the blobs rewritten revisions now reference.
  for (const auto& [id, rw] : spec.rewrites) {
    const std::string key = BE128(rw.blob.hash.high, rw.blob.hash.low);
    if (blob_rows.count(key)) continue;
    auto it = refs.find(HashKey{rw.blob.hash.high, rw.blob.hash.low});
    if (it == refs.end() || it->second == 0) continue;
    BlobRecord b;
    b.relpath = rw.relpath;
    b.bytes = rw.blob.bytes;
    b.refcount = it->second;
    b.kind = BlobKind::kAdapter;
    out.kept_blob_relpaths.insert(b.relpath);
    blob_rows.emplace(key, codec::EncodeBlob(b));
  }
  out.blob_records_kept = blob_rows.size();
  {
    MDB_stat st;
    mdb_stat(rtxn.get(), sdbi[kPolicyById], &st);
    out.policies = st.ms_entries;
    out.aliases = out.alias_values.size();
  }
  // revisions_by_blob entries of the rebuilt catalog: every kept record with a blob.
  std::vector<std::pair<HashKey, uint64_t>> index;
  if (spec.target_version >= 2) {
    for (const RevInfo& r : revs) {
      if (r.keep && r.has_blob) index.push_back({{r.blob.high, r.blob.low}, r.id});
    }
    std::sort(index.begin(), index.end(), [](const auto& a, const auto& b) {
      if (a.first.high != b.first.high) return a.first.high < b.first.high;
      if (a.first.low != b.first.low) return a.first.low < b.first.low;
      return a.second < b.second;
    });
    out.index_entries = index.size();
  }
  if (dst_env_dir.empty()) return out;

  // ---- write the new environment in key order.
  LORADB_RETURN_IF_ERROR(CreateDirectories(dst_env_dir));
  const uint64_t src_bytes = FileBytes(src_env_dir + "/data.mdb");
  uint64_t map_bytes = uint64_t{1} << 30;
  while (map_bytes < src_bytes * 2 + (uint64_t{64} << 20)) map_bytes *= 2;
  Env dst;
  LORADB_RETURN_IF_ERROR(dst.Open(dst_env_dir, MDB_NOSYNC, map_bytes));
  Appender app(dst.get(), spec.target_version, 50000);
  LORADB_RETURN_IF_ERROR(app.Start());

  auto copy_db = [&](size_t db) -> absl::Status {
    Cursor c(rtxn.get(), sdbi[db]);
    LORADB_RETURN_IF_ERROR(c.status());
    MDB_val k, v;
    int rc;
    for (rc = c.Get(&k, &v, MDB_FIRST); rc == 0; rc = c.Get(&k, &v, MDB_NEXT)) {
      if (db == kMeta && k.mv_size == 14 && std::memcmp(k.mv_data, "schema_version", 14) == 0) {
        const std::string ver = BE64(spec.target_version);
        LORADB_RETURN_IF_ERROR(app.Append(db, k, Val(ver)));
        continue;
      }
      LORADB_RETURN_IF_ERROR(app.Append(db, k, v));
    }
    if (rc != MDB_NOTFOUND) return Lmdb(rc, absl::StrCat("scan ", kDbs[db].name));
    return absl::OkStatus();
  };
  for (size_t db : {kMeta, kBases}) LORADB_RETURN_IF_ERROR(copy_db(db));
  if (out.source_version < 5 && spec.target_version >= 5) {
    // Schema v5 keys the name index by length, then name: a different order, so the entries
    // are re-keyed and sorted before they are appended.
    std::vector<std::pair<std::string, std::string>> names;
    Cursor c(rtxn.get(), sdbi[kPolicies]);
    LORADB_RETURN_IF_ERROR(c.status());
    MDB_val k, v;
    int rc;
    for (rc = c.Get(&k, &v, MDB_FIRST); rc == 0; rc = c.Get(&k, &v, MDB_NEXT)) {
      if (k.mv_size > 255) return absl::DataLossError("catalog: policy name key is too long");
      std::string key(catalog_keys::kMaxPolicyNameKey, '\0');
      key.resize(catalog_keys::PutPolicyNameKey(static_cast<const char*>(k.mv_data), k.mv_size,
                                                reinterpret_cast<uint8_t*>(key.data())));
      names.emplace_back(std::move(key),
                         std::string(static_cast<const char*>(v.mv_data), v.mv_size));
    }
    if (rc != MDB_NOTFOUND) return Lmdb(rc, "scan policies");
    std::sort(names.begin(), names.end());
    for (const auto& [key, value] : names) {
      LORADB_RETURN_IF_ERROR(app.Append(kPolicies, Val(key), Val(value)));
    }
  } else {
    LORADB_RETURN_IF_ERROR(copy_db(kPolicies));
  }
  {
    // Schema v3 reads a policy's next seq as max(record, highest indexed seq + 1), and the
    // rebuild may drop the index entries of deleted revisions: the record carries the source's
    // next seq so no seq is handed out twice.
    absl::flat_hash_map<uint64_t, uint64_t> last_seq;
    for (const RevInfo& r : revs) last_seq[r.policy_id] = std::max(last_seq[r.policy_id], r.seq);
    Cursor c(rtxn.get(), sdbi[kPolicyById]);
    LORADB_RETURN_IF_ERROR(c.status());
    MDB_val k, v;
    int rc;
    // Schema v7 policy records leave their id to the key: a migration to it rewrites each one.
    const bool drop_ids = out.source_version < 7 && spec.target_version >= 7;
    for (rc = c.Get(&k, &v, MDB_FIRST); rc == 0; rc = c.Get(&k, &v, MDB_NEXT)) {
      LORADB_ASSIGN_OR_RETURN(PolicyRecord pr, codec::DecodePolicy(Bytes(v), GetBE64(k.mv_data)));
      auto it = last_seq.find(pr.id);
      const bool bump = it != last_seq.end() && pr.next_seq <= it->second;
      if (!bump && !drop_ids) {
        LORADB_RETURN_IF_ERROR(app.Append(kPolicyById, k, v));
        continue;
      }
      if (bump) pr.next_seq = it->second + 1;
      const std::string bytes =
          spec.target_version >= 7 ? codec::EncodePolicy(pr) : codec::EncodePolicyWithId(pr);
      LORADB_RETURN_IF_ERROR(app.Append(kPolicyById, k, Val(bytes)));
    }
    if (rc != MDB_NOTFOUND) return Lmdb(rc, "scan policy_by_id");
  }
  {
    // Schema v4 stores revision records in layout 2, v6 in layout 3 and v7 in layout 4: a
    // migration across any of them rewrites every one (the others are copied as they are).
    const bool relayout =
        RevisionLayoutOf(out.source_version) != RevisionLayoutOf(spec.target_version);
    Cursor c(rtxn.get(), sdbi[kRevisions]);
    LORADB_RETURN_IF_ERROR(c.status());
    MDB_val k, v;
    size_t i = 0;
    int rc;
    for (rc = c.Get(&k, &v, MDB_FIRST); rc == 0; rc = c.Get(&k, &v, MDB_NEXT), ++i) {
      if (i >= revs.size() || revs[i].id != GetBE64(k.mv_data)) {
        return absl::AbortedError("catalog changed during the rebuild");
      }
      auto rw = spec.rewrites.find(revs[i].id);
      if (revs[i].keep && (rw != spec.rewrites.end() || relayout)) {
        LORADB_ASSIGN_OR_RETURN(RevisionRecord r,
                                codec::DecodeRevision(Bytes(v), revs[i].id, policy_base));
        if (rw != spec.rewrites.end() && r.state == RevisionState::kLive) {
          r.blob = rw->second.blob;
          r.layout = rw->second.layout;
        }
        const int layout = RevisionLayoutOf(spec.target_version);
        std::string bytes;
        if (layout == 4) {
          LORADB_ASSIGN_OR_RETURN(const std::string base, policy_base(r.policy_id));
          bytes = codec::EncodeRevision(r, base);
        } else {
          bytes = layout == 3   ? codec::EncodeRevisionLayout3(r)
                  : layout == 2 ? codec::EncodeRevisionLayout2(r)
                                : codec::EncodeRevisionLayout1(r);
        }
        LORADB_RETURN_IF_ERROR(app.Append(kRevisions, k, Val(bytes)));
      } else if (revs[i].keep) {
        LORADB_RETURN_IF_ERROR(app.Append(kRevisions, k, v));
      }
      if ((i & 0xffff) == 0) Report(spec, "write", i, revs.size());
    }
    if (rc != MDB_NOTFOUND) return Lmdb(rc, "scan revisions");
    Report(spec, "write", revs.size(), revs.size());
  }
  {
    absl::flat_hash_set<uint64_t> dropped;
    for (const RevInfo& r : revs) {
      if (!r.keep) dropped.insert(r.id);
    }
    Cursor c(rtxn.get(), sdbi[kPolicyRevisions]);
    LORADB_RETURN_IF_ERROR(c.status());
    MDB_val k, v;
    int rc;
    for (rc = c.Get(&k, &v, MDB_FIRST); rc == 0; rc = c.Get(&k, &v, MDB_NEXT)) {
      if (v.mv_size != 16) return absl::DataLossError("catalog: bad policy revision entry");
      if (dropped.count(GetBE64(static_cast<const uint8_t*>(v.mv_data) + 8))) continue;
      LORADB_RETURN_IF_ERROR(app.Append(kPolicyRevisions, k, v));
    }
    if (rc != MDB_NOTFOUND) return Lmdb(rc, "scan policy_revisions");
  }
  // v7 drops `aliases` (CheckAliases found each one equal to its log's last `to`).
  for (size_t db : {kAliases, kAliasLog, kCheckpoints, kPolicyCheckpoints}) {
    if (kDbs[db].in(spec.target_version)) LORADB_RETURN_IF_ERROR(copy_db(db));
  }
  for (const auto& [key, value] : blob_rows) {
    LORADB_RETURN_IF_ERROR(app.Append(kBlobs, Val(key), Val(value)));
  }
  for (const auto& [hash, id] : index) {
    const std::string key = BE128(hash.high, hash.low);
    const std::string value = BE64(id);
    LORADB_RETURN_IF_ERROR(app.Append(kRevisionsByBlob, Val(key), Val(value)));
  }
  LORADB_RETURN_IF_ERROR(app.Finish());
  rtxn.Abort();
  src.Close();
  int rc = mdb_env_sync(dst.get(), 1);
  if (rc != 0) return Lmdb(rc, "sync new catalog");
  dst.Close();
  LORADB_RETURN_IF_ERROR(FsyncFile(dst_env_dir + "/data.mdb"));
  LORADB_RETURN_IF_ERROR(FaultPoint("maint.after_build"));
  return out;
}

// ---- the v1 writer

absl::Status WriteV1Catalog(const std::string& store_dir, const V1Catalog& cat, bool no_sync) {
  const std::string env_dir = store_dir + "/catalog";
  struct stat st;
  if (::stat((env_dir + "/data.mdb").c_str(), &st) == 0) {
    return absl::AlreadyExistsError(absl::StrCat("'", store_dir, "' already holds a catalog"));
  }
  LORADB_RETURN_IF_ERROR(CreateDirectories(env_dir));
  Env env;
  LORADB_RETURN_IF_ERROR(env.Open(env_dir, no_sync ? MDB_NOSYNC : 0, uint64_t{1} << 30));
  Appender app(env.get(), 1, 50000);
  LORADB_RETURN_IF_ERROR(app.Start());
  // meta, keys in memcmp order.
  LORADB_RETURN_IF_ERROR(
      app.Append(kMeta, Val(std::string("created_us")), Val(BE64(cat.created_us))));
  LORADB_RETURN_IF_ERROR(app.Append(kMeta, Val(std::string("schema_version")), Val(BE64(1))));
  LORADB_RETURN_IF_ERROR(app.Append(kMeta, Val(std::string("store_id")), Val(cat.store_id)));

  std::vector<BaseRecord> bases = cat.bases;
  std::sort(bases.begin(), bases.end(), [](auto& a, auto& b) { return a.name < b.name; });
  for (const BaseRecord& b : bases) {
    LORADB_RETURN_IF_ERROR(app.Append(kBases, Val(b.name), Val(codec::EncodeBase(b))));
  }
  std::vector<PolicyRecord> policies = cat.policies;
  std::sort(policies.begin(), policies.end(), [](auto& a, auto& b) { return a.name < b.name; });
  for (const PolicyRecord& p : policies) {
    LORADB_RETURN_IF_ERROR(app.Append(kPolicies, Val(p.name), Val(BE64(p.id))));
  }
  std::sort(policies.begin(), policies.end(), [](auto& a, auto& b) { return a.id < b.id; });
  for (const PolicyRecord& p : policies) {
    LORADB_RETURN_IF_ERROR(
        app.Append(kPolicyById, Val(BE64(p.id)), Val(codec::EncodePolicyWithId(p))));
  }
  // Revisions (ids ascending), and the (policy, seq, id) index.
  std::vector<std::array<uint64_t, 3>> pr;
  auto add_revision = [&](const RevisionRecord& r) -> absl::Status {
    pr.push_back({r.policy_id, r.seq, r.id});
    return app.Append(kRevisions, Val(BE64(r.id)), Val(codec::EncodeRevisionLayout1(r)));
  };
  if (cat.generate_revision) {
    for (uint64_t id = 1; id <= cat.generated_revisions; ++id) {
      LORADB_RETURN_IF_ERROR(add_revision(cat.generate_revision(id)));
    }
  } else {
    std::vector<RevisionRecord> revs = cat.revisions;
    std::sort(revs.begin(), revs.end(), [](auto& a, auto& b) { return a.id < b.id; });
    for (const RevisionRecord& r : revs) LORADB_RETURN_IF_ERROR(add_revision(r));
  }
  std::sort(pr.begin(), pr.end());
  for (const auto& e : pr) {
    LORADB_RETURN_IF_ERROR(app.Append(kPolicyRevisions, Val(BE64(e[0])), Val(BE128(e[1], e[2]))));
  }
  std::vector<std::pair<std::string, uint64_t>> aliases;
  for (const auto& a : cat.aliases) aliases.push_back({BE64(a.policy_id) + a.alias, a.revision});
  std::sort(aliases.begin(), aliases.end());
  for (const auto& [k, id] : aliases) {
    LORADB_RETURN_IF_ERROR(app.Append(kAliases, Val(k), Val(BE64(id))));
  }
  std::vector<std::pair<std::string, std::string>> log;
  for (const auto& e : cat.alias_log) {
    std::string k = BE64(e.policy_id);
    k.push_back(static_cast<char>(e.alias.size()));
    k += e.alias + BE64(e.number);
    log.push_back({k, codec::EncodeAliasLogEntryLayout1(e.entry)});
  }
  std::sort(log.begin(), log.end());
  for (const auto& [k, v] : log) LORADB_RETURN_IF_ERROR(app.Append(kAliasLog, Val(k), Val(v)));
  std::vector<CheckpointRecord> cks = cat.checkpoints;
  std::sort(cks.begin(), cks.end(), [](auto& a, auto& b) { return a.id < b.id; });
  std::vector<std::array<uint64_t, 3>> pc;
  for (const CheckpointRecord& c : cks) {
    LORADB_RETURN_IF_ERROR(
        app.Append(kCheckpoints, Val(BE64(c.id)), Val(codec::EncodeCheckpoint(c))));
    pc.push_back({c.policy_id, c.step, c.id});
  }
  std::sort(pc.begin(), pc.end());
  for (const auto& e : pc) {
    LORADB_RETURN_IF_ERROR(app.Append(kPolicyCheckpoints, Val(BE64(e[0])), Val(BE128(e[1], e[2]))));
  }
  std::vector<std::pair<std::string, std::string>> blobs;
  for (const BlobRecord& b : cat.blobs) {
    blobs.push_back({BE128(b.hash.high, b.hash.low), codec::EncodeBlob(b)});
  }
  std::sort(blobs.begin(), blobs.end());
  for (const auto& [k, v] : blobs) LORADB_RETURN_IF_ERROR(app.Append(kBlobs, Val(k), Val(v)));
  LORADB_RETURN_IF_ERROR(app.Finish());
  int rc = mdb_env_sync(env.get(), 1);
  if (rc != 0) return Lmdb(rc, "sync v1 catalog");
  return absl::OkStatus();
}

}  // namespace loradb::maint_internal
