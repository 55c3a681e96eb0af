#include "storage/catalog/catalog.h"

#include <fcntl.h>
#include <lmdb.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <chrono>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <map>
#include <random>

#include "absl/strings/str_cat.h"
#include "storage/catalog/codec.h"
#include "storage/catalog/codec_tables.h"
#include "storage/catalog/key_encoding.h"
#include "storage/catalog/lmdb_txn.h"
#include "storage/util/fault_injection.h"
#include "storage/util/file_util.h"
#include "storage/util/status_macros.h"

namespace loradb {

namespace codec = catalog_codec;
using catalog_lmdb::AliasLogKey;
using catalog_lmdb::Cursor;
using catalog_lmdb::Get;
using catalog_lmdb::GetBE64;
using catalog_lmdb::LmdbError;
using catalog_lmdb::PutBE64;
using catalog_lmdb::ResolveNextSeq;
using catalog_lmdb::StrVal;
using catalog_lmdb::TxnForEachAlias;
using catalog_lmdb::TxnRevisionView;
using catalog_lmdb::U128Key;
using catalog_lmdb::U64Key;
using catalog_lmdb::ValBytes;

namespace {

int64_t NowMicros() {
  return std::chrono::duration_cast<std::chrono::microseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

absl::Status Put(MDB_txn* txn, MDB_dbi dbi, MDB_val k, MDB_val v, unsigned flags,
                 absl::string_view what) {
  int rc = mdb_put(txn, dbi, &k, &v, flags);
  if (rc == 0) return absl::OkStatus();
  return LmdbError(rc, what);
}

// The largest u64 key of `dbi`, or 0 when it is empty.
absl::StatusOr<uint64_t> LastU64Key(MDB_txn* txn, MDB_dbi dbi) {
  Cursor c(txn, dbi);
  LORADB_RETURN_IF_ERROR(c.status());
  MDB_val k, v;
  int rc = c.Get(&k, &v, MDB_LAST);
  if (rc == MDB_NOTFOUND) return 0;
  if (rc != 0) return LmdbError(rc, "last key");
  if (k.mv_size != 8) return absl::DataLossError("catalog: id key is not 8 bytes");
  return GetBE64(k.mv_data);
}

// ---- typed accessors used inside transactions

absl::StatusOr<PolicyRecord> TxnGetPolicyById(MDB_txn* txn, const Catalog::Dbis& d, uint64_t id) {
  U64Key k(id);
  MDB_val v;
  absl::Status st = Get(txn, d.policy_by_id, k.val(), &v, "policy");
  if (absl::IsNotFound(st)) return absl::NotFoundError(absl::StrCat("no policy with id ", id));
  LORADB_RETURN_IF_ERROR(st);
  LORADB_ASSIGN_OR_RETURN(PolicyRecord p, codec::DecodePolicy(ValBytes(v), id));
  LORADB_RETURN_IF_ERROR(ResolveNextSeq(txn, d, &p));
  return p;
}

absl::StatusOr<PolicyRecord> TxnGetPolicy(MDB_txn* txn, const Catalog::Dbis& d,
                                          const std::string& name) {
  LORADB_ASSIGN_OR_RETURN(const uint64_t id, catalog_lmdb::TxnPolicyIdByName(txn, d, name));
  return TxnGetPolicyById(txn, d, id);
}

absl::Status TxnPutPolicy(MDB_txn* txn, const Catalog::Dbis& d, const PolicyRecord& p) {
  U64Key k(p.id);
  const std::string bytes = codec::EncodePolicy(p);
  return Put(txn, d.policy_by_id, k.val(), StrVal(bytes), 0, "put policy");
}

absl::StatusOr<RevisionRecord> TxnGetRevision(MDB_txn* txn, const Catalog::Dbis& d, uint64_t id) {
  CatalogViewScope scope(txn, &d);
  LORADB_ASSIGN_OR_RETURN(RevisionView v, TxnRevisionView(txn, d, id, scope));
  return v.ToRecord();
}

// Rewrites revision `r` (its base left out when it is its policy's, as Publish writes it).
absl::Status TxnPutRevision(MDB_txn* txn, const Catalog::Dbis& d, const RevisionRecord& r,
                            unsigned flags) {
  CatalogViewScope scope(txn, &d);
  LORADB_ASSIGN_OR_RETURN(PolicyView policy,
                          catalog_lmdb::TxnPolicyViewById(txn, d, r.policy_id, scope));
  U64Key k(r.id);
  const std::string bytes = codec::EncodeRevision(r, policy.base());
  return Put(txn, d.revisions, k.val(), StrVal(bytes), flags, "put revision");
}

// The last log entry of an alias (its number in `seq`; its `to` is the alias's value); NotFound
// when the alias has no entry, that is, was never set.
absl::StatusOr<AliasLogEntry> TxnLastAliasLog(MDB_txn* txn, const Catalog::Dbis& d,
                                              uint64_t policy_id, const std::string& alias) {
  AliasLogKey key(policy_id, alias);
  Cursor c(txn, d.alias_log);
  LORADB_RETURN_IF_ERROR(c.status());
  MDB_val k, v;
  const int rc = catalog_lmdb::SeekLastAliasLogEntry(c.get(), key, &k, &v);
  if (rc == MDB_NOTFOUND)
    return absl::NotFoundError(absl::StrCat("alias '", alias, "' has no log"));
  if (rc != 0) return LmdbError(rc, "alias log");
  LORADB_ASSIGN_OR_RETURN(AliasLogEntry e, codec::DecodeAliasLogEntry(ValBytes(v)));
  e.alias = alias;
  e.seq = GetBE64(static_cast<const uint8_t*>(k.mv_data) + key.prefix_size);
  return e;
}

absl::Status TxnSetAlias(MDB_txn* txn, const Catalog::Dbis& d, const PolicyRecord& policy,
                         const std::string& alias, uint64_t to, const std::string& reason,
                         int64_t now) {
  LORADB_RETURN_IF_ERROR(ValidateSettableAlias(alias));
  if (policy.archived) {
    return absl::FailedPreconditionError(
        absl::StrCat("policy '", policy.name, "' is archived; its aliases cannot move"));
  }
  CatalogViewScope scope(txn, &d);
  LORADB_ASSIGN_OR_RETURN(RevisionView rev, TxnRevisionView(txn, d, to, scope));
  if (rev.policy_id() != policy.id) {
    return absl::InvalidArgumentError(absl::StrCat("revision ", to,
                                                   " belongs to another policy (id ",
                                                   rev.policy_id(), "), not '", policy.name, "'"));
  }
  if (!rev.live()) {
    return absl::FailedPreconditionError(absl::StrCat("revision ", to, " is deleted"));
  }
  // The alias's value is the `to` of its last log entry (none: not set). The new entry's number
  // is taken inside this write transaction (LMDB has one writer at a time), so numbers follow
  // commit order whatever the clock does.
  uint64_t from = 0;
  uint64_t n = 1;
  auto last = TxnLastAliasLog(txn, d, policy.id, alias);
  if (last.ok()) {
    from = last->to_revision;
    n = last->seq + 1;
  } else if (!absl::IsNotFound(last.status())) {
    return last.status();
  }
  if (from == to) return absl::OkStatus();
  AliasLogKey log_key(policy.id, alias);
  AliasLogEntry e;
  e.time_us = now;
  e.from_revision = from;
  e.to_revision = to;
  e.reason = reason;
  const std::string bytes = codec::EncodeAliasLogEntry(e);
  return Put(txn, d.alias_log, log_key.entry(n), StrVal(bytes), MDB_NOOVERWRITE, "put alias log");
}

// The stored record of the blob `ref`, or a new one (refcount 0, named `relpath` or the default
// path) when there is none. DataLoss when the record's size is not the reference's.
absl::StatusOr<BlobRecord> TxnBlobOrNew(MDB_txn* txn, const Catalog::Dbis& d, const BlobRef& ref,
                                        const std::string& relpath, BlobKind kind) {
  U128Key k(ref.hash.high, ref.hash.low);
  MDB_val v;
  BlobRecord b;
  absl::Status st = Get(txn, d.blobs, k.val(), &v, "blob");
  if (st.ok()) {
    LORADB_ASSIGN_OR_RETURN(b, codec::DecodeBlob(ValBytes(v)));
    if (b.bytes != ref.bytes) {
      return absl::DataLossError(absl::StrCat("blob ", ref.hash.Hex(), " is recorded with ",
                                              b.bytes, " bytes but referenced with ", ref.bytes));
    }
  } else if (absl::IsNotFound(st)) {
    b.relpath = relpath.empty() ? BlobRelPath(ref.hash) : relpath;
    b.bytes = ref.bytes;
    b.refcount = 0;
    b.kind = kind;
  } else {
    return st;
  }
  return b;
}

absl::Status TxnPutBlob(MDB_txn* txn, const Catalog::Dbis& d, const Hash128& hash,
                        const BlobRecord& b) {
  U128Key k(hash.high, hash.low);
  const std::string bytes = codec::EncodeBlob(b);
  return Put(txn, d.blobs, k.val(), StrVal(bytes), 0, "put blob");
}

// Takes one reference on the blob `ref`, creating its record when absent.
absl::Status TxnRefBlob(MDB_txn* txn, const Catalog::Dbis& d, const BlobRef& ref,
                        const std::string& relpath, BlobKind kind) {
  if (ref.empty()) return absl::OkStatus();
  LORADB_ASSIGN_OR_RETURN(BlobRecord b, TxnBlobOrNew(txn, d, ref, relpath, kind));
  ++b.refcount;
  return TxnPutBlob(txn, d, ref.hash, b);
}

absl::Status TxnUnrefBlob(MDB_txn* txn, const Catalog::Dbis& d, const BlobRef& ref) {
  if (ref.empty()) return absl::OkStatus();
  U128Key k(ref.hash.high, ref.hash.low);
  MDB_val v;
  LORADB_RETURN_IF_ERROR(Get(txn, d.blobs, k.val(), &v, "blob"));
  LORADB_ASSIGN_OR_RETURN(BlobRecord b, codec::DecodeBlob(ValBytes(v)));
  if (b.refcount == 0) {
    return absl::DataLossError(absl::StrCat("blob ", ref.hash.Hex(), " refcount underflow"));
  }
  --b.refcount;
  const std::string bytes = codec::EncodeBlob(b);
  return Put(txn, d.blobs, k.val(), StrVal(bytes), 0, "put blob");
}

absl::StatusOr<PolicyRecord> TxnCreatePolicy(MDB_txn* txn, const Catalog::Dbis& d,
                                             const std::string& name, const std::string& base,
                                             const std::map<std::string, std::string>& labels,
                                             int64_t now) {
  LORADB_RETURN_IF_ERROR(ValidatePolicyName(name));
  MDB_val v;
  absl::Status st = Get(txn, d.bases, StrVal(base), &v, "base");
  if (absl::IsNotFound(st)) return absl::NotFoundError(absl::StrCat("no base named '", base, "'"));
  LORADB_RETURN_IF_ERROR(st);
  LORADB_ASSIGN_OR_RETURN(uint64_t last, LastU64Key(txn, d.policy_by_id));
  PolicyRecord p;
  p.id = last + 1;
  p.name = name;
  p.base = base;
  p.labels = labels;
  p.created_us = now;
  p.next_seq = 1;
  U64Key id(p.id);
  catalog_lmdb::PolicyNameKey name_key(name);
  st = Put(txn, d.policies, name_key.val(), id.val(), MDB_NOOVERWRITE, "put policy name");
  if (absl::IsAlreadyExists(st)) {
    return absl::AlreadyExistsError(absl::StrCat("policy '", name, "' already exists"));
  }
  LORADB_RETURN_IF_ERROR(st);
  // Stored with next_seq 0, which FlatBuffers leaves out (8 bytes less per policy): the next seq
  // is max(record, highest indexed seq + 1), 1 for a policy without revisions either way.
  PolicyRecord stored = p;
  stored.next_seq = 0;
  LORADB_RETURN_IF_ERROR(TxnPutPolicy(txn, d, stored));
  return p;
}

// The publishes of one write transaction. What every publish reads is read once per
// transaction: the last revision id, each policy's record and next seq, each blob's record; the
// blob records are written once, by Finish. Per revision that leaves the record and its two
// index entries (and the alias move when asked). The record is built in one reused
// FlatBufferBuilder and handed to LMDB from there.
class TxnPublisher {
 public:
  TxnPublisher(MDB_txn* txn, const Catalog::Dbis& d, int64_t now) : txn_(txn), d_(d), now_(now) {}

  // Publishes `nr` (errors as Catalog::Publish); its record goes to `*out` when non-null.
  absl::StatusOr<uint64_t> Publish(const NewRevision& nr, const std::string& relpath,
                                   RevisionRecord* out);
  // Writes the blob records the publishes referenced; call before the commit.
  absl::Status Finish();

 private:
  absl::StatusOr<PolicyRecord*> PolicyOf(const NewRevision& nr);
  // One more reference on `ref` (its record read, or made, on the first one).
  absl::Status RefBlob(const BlobRef& ref, const std::string& relpath);

  MDB_txn* txn_;
  const Catalog::Dbis& d_;
  int64_t now_;
  uint64_t last_id_ = 0;
  bool have_last_id_ = false;
  std::map<uint64_t, PolicyRecord> policies_;  // next_seq: the seq the next publish gets
  std::map<std::pair<uint64_t, uint64_t>, BlobRecord> blobs_;  // by hash (high, low)
  RevisionRecord r_;  // reused: its strings and vectors keep their capacity
  flatbuffers::FlatBufferBuilder fbb_{512};
};

absl::StatusOr<PolicyRecord*> TxnPublisher::PolicyOf(const NewRevision& nr) {
  if (nr.policy_id == 0 && !nr.create_policy.empty()) {
    LORADB_ASSIGN_OR_RETURN(PolicyRecord p, TxnCreatePolicy(txn_, d_, nr.create_policy,
                                                            nr.create_policy_base, {}, now_));
    const uint64_t id = p.id;
    return &(policies_[id] = std::move(p));
  }
  auto it = policies_.find(nr.policy_id);
  if (it != policies_.end()) return &it->second;
  LORADB_ASSIGN_OR_RETURN(PolicyRecord p, TxnGetPolicyById(txn_, d_, nr.policy_id));
  return &(policies_[nr.policy_id] = std::move(p));
}

absl::Status TxnPublisher::RefBlob(const BlobRef& ref, const std::string& relpath) {
  if (ref.empty()) return absl::OkStatus();
  const std::pair<uint64_t, uint64_t> key(ref.hash.high, ref.hash.low);
  auto it = blobs_.find(key);
  if (it == blobs_.end()) {
    LORADB_ASSIGN_OR_RETURN(BlobRecord b, TxnBlobOrNew(txn_, d_, ref, relpath, BlobKind::kAdapter));
    b.hash = ref.hash;
    it = blobs_.emplace(key, std::move(b)).first;
  } else if (it->second.bytes != ref.bytes) {
    return absl::DataLossError(absl::StrCat("blob ", ref.hash.Hex(), " is recorded with ",
                                            it->second.bytes, " bytes but referenced with ",
                                            ref.bytes));
  }
  ++it->second.refcount;
  return absl::OkStatus();
}

absl::Status TxnPublisher::Finish() {
  for (const auto& [key, b] : blobs_) LORADB_RETURN_IF_ERROR(TxnPutBlob(txn_, d_, b.hash, b));
  blobs_.clear();
  return absl::OkStatus();
}

absl::StatusOr<uint64_t> TxnPublisher::Publish(const NewRevision& nr, const std::string& relpath,
                                               RevisionRecord* out) {
  LORADB_ASSIGN_OR_RETURN(PolicyRecord * policy, PolicyOf(nr));
  if (policy->archived) {
    return absl::FailedPreconditionError(
        absl::StrCat("policy '", policy->name, "' is archived; it accepts no new revisions"));
  }
  if (nr.parent != 0) {
    CatalogViewScope scope(txn_, &d_);
    LORADB_RETURN_IF_ERROR(TxnRevisionView(txn_, d_, nr.parent, scope).status());
  }
  if (!have_last_id_) {
    LORADB_ASSIGN_OR_RETURN(last_id_, LastU64Key(txn_, d_.revisions));
    have_last_id_ = true;
  }
  RevisionRecord& r = r_;
  r.id = last_id_ + 1;
  r.policy_id = policy->id;
  r.seq = policy->next_seq;
  r.base = policy->base;
  r.parent = nr.parent;
  r.source = nr.source;
  r.lora = nr.lora;
  r.dtype = nr.dtype;
  r.layout = nr.layout;
  r.blob = nr.blob;
  r.created_us = now_;
  r.state = RevisionState::kLive;
  r.evals = nr.evals;
  // The policy record is not rewritten: the index entry below advances its next seq (v3).
  // The base is the policy's: the record leaves it out (v7), readers take it from the policy.
  codec::BuildRevision(fbb_, r, policy->base);
  U64Key rk(r.id);
  LORADB_RETURN_IF_ERROR(Put(txn_, d_.revisions, rk.val(),
                             MDB_val{fbb_.GetSize(), fbb_.GetBufferPointer()}, MDB_APPEND,
                             "put revision"));
  // Both index entries sort after every existing duplicate of their key (the seq is past the
  // policy's highest, the id past every id): MDB_APPENDDUP fills the duplicate pages instead of
  // splitting them in half (LMDB fails with MDB_KEYEXIST if that ever stops holding).
  U64Key pk(policy->id);
  U128Key entry(r.seq, r.id);
  LORADB_RETURN_IF_ERROR(Put(txn_, d_.policy_revisions, pk.val(), entry.val(), MDB_APPENDDUP,
                             "put policy revision index"));
  LORADB_RETURN_IF_ERROR(RefBlob(r.blob, relpath));
  if (!r.blob.empty()) {
    U128Key bk(r.blob.hash.high, r.blob.hash.low);
    LORADB_RETURN_IF_ERROR(Put(txn_, d_.revisions_by_blob, bk.val(), rk.val(), MDB_APPENDDUP,
                               "put revisions-by-blob index"));
  }
  last_id_ = r.id;
  ++policy->next_seq;
  if (!nr.alias.empty()) {
    LORADB_RETURN_IF_ERROR(TxnSetAlias(txn_, d_, *policy, nr.alias, r.id, nr.alias_reason, now_));
  }
  if (out != nullptr) *out = r;
  return r.id;
}

// Registry of open environments in this process, keyed by the canonical directory.
Mutex& RegistryMutex() {
  static auto* mu = new Mutex();
  return *mu;
}
std::map<std::string, std::weak_ptr<Catalog>>& Registry() {
  static auto* r = new std::map<std::string, std::weak_ptr<Catalog>>();
  return *r;
}

std::string NewStoreId() {
  std::random_device rd;
  std::mt19937_64 gen((uint64_t{rd()} << 32) ^ rd() ^ static_cast<uint64_t>(NowMicros()) ^
                      static_cast<uint64_t>(getpid()));
  return Hash128{gen(), gen()}.Hex();
}

}  // namespace

// ---- lifecycle

Catalog::Catalog(std::string dir, const CatalogOptions& options)
    : dir_(std::move(dir)), options_(options), dbi_(std::make_unique<Dbis>()), pid_(getpid()) {}

Catalog::~Catalog() {
  {
    MutexLock lock(&pool_mu_);
    for (auto& slot : slots_) {
      if (slot->alias_log != nullptr) mdb_cursor_close(slot->alias_log);
      slot->alias_log = nullptr;
      if (slot->txn != nullptr) mdb_txn_abort(slot->txn);
      slot->txn = nullptr;
    }
  }
  if (env_ != nullptr) mdb_env_close(env_);
}

absl::Status Catalog::CheckStoreDirectory(const std::string& dir) {
  struct stat st;
  if (::stat(dir.c_str(), &st) != 0) {
    if (errno == ENOENT) return absl::OkStatus();
    return ErrnoToStatus(errno, absl::StrCat("store directory '", dir, "'"));
  }
  if (!S_ISDIR(st.st_mode)) {
    return absl::InvalidArgumentError(
        absl::StrCat("'", dir, "' is not a store directory: it is ",
                     S_ISREG(st.st_mode) ? "a regular file" : "not a directory",
                     " (a store is a directory holding catalog/; `loradb init DIR` creates one)"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<Catalog>> Catalog::Open(const std::string& dir,
                                                       const CatalogOptions& options) {
  LORADB_RETURN_IF_ERROR(CheckStoreDirectory(dir));
  struct stat st;
  if (::stat(dir.c_str(), &st) != 0) {
    if (!options.create_if_missing) {
      return absl::NotFoundError(absl::StrCat("catalog: no store at '", dir, "'"));
    }
    LORADB_RETURN_IF_ERROR(CreateDirectories(dir));
  }
  char* real = ::realpath(dir.c_str(), nullptr);
  if (real == nullptr) return ErrnoToStatus(errno, absl::StrCat("catalog: realpath ", dir));
  std::string canonical(real);
  std::free(real);

  MutexLock lock(&RegistryMutex());
  auto it = Registry().find(canonical);
  if (it != Registry().end()) {
    if (auto existing = it->second.lock()) {
      if (existing->pid_ != getpid()) {
        return absl::FailedPreconditionError(
            absl::StrCat("catalog: the environment of '", dir,
                         "' was opened before fork(); reopen it in the "
                         "child is not allowed while the parent's handle is alive"));
      }
      return existing;
    }
  }
  std::shared_ptr<Catalog> c(new Catalog(canonical, options));
  LORADB_RETURN_IF_ERROR(c->Init());
  Registry()[canonical] = c;
  return c;
}

absl::Status Catalog::Init() {
  const std::string env_dir = dir_ + "/catalog";
  struct stat sb;
  const bool exists = ::stat((env_dir + "/data.mdb").c_str(), &sb) == 0;
  if (!exists && (!options_.create_if_missing || options_.read_only)) {
    return absl::NotFoundError(absl::StrCat("catalog: no catalog in '", dir_, "'"));
  }
  if (options_.no_lock && !options_.read_only) {
    return absl::InvalidArgumentError("catalog: no_lock requires read_only");
  }
  if (!options_.read_only) LORADB_RETURN_IF_ERROR(CreateDirectories(env_dir));
  int rc = mdb_env_create(&env_);
  if (rc != 0) return LmdbError(rc, "env create");
  mdb_env_set_maxdbs(env_, 16);
  mdb_env_set_maxreaders(env_, 512);
  rc = mdb_env_set_mapsize(env_, options_.initial_map_bytes);
  if (rc != 0) return LmdbError(rc, "set map size");
  unsigned flags = MDB_NOTLS;
  if (options_.no_sync) flags |= MDB_NOSYNC;
  if (options_.read_only) flags |= MDB_RDONLY;
  if (options_.no_lock) flags |= MDB_NOLOCK;
  rc = mdb_env_open(env_, env_dir.c_str(), flags, 0644);
  if (rc != 0) return LmdbError(rc, absl::StrCat("open ", env_dir));
  int dead = 0;
  rc = mdb_reader_check(env_, &dead);
  if (rc != 0) return LmdbError(rc, "reader check");

  // Existing store: open the named databases in a read transaction; otherwise create them.
  auto open_all = [&](MDB_txn* txn, unsigned create) -> absl::Status {
    for (const catalog_lmdb::NamedDb& db : catalog_lmdb::kNamedDbs) {
      int r = mdb_dbi_open(txn, db.name, db.flags | create, &(dbi_.get()->*db.dbi));
      if (r != 0) return LmdbError(r, absl::StrCat("open database ", db.name));
    }
    return absl::OkStatus();
  };
  auto read_meta = [&](MDB_txn* txn) -> absl::Status {
    MDB_val v;
    std::string k = "schema_version";
    LORADB_RETURN_IF_ERROR(Get(txn, dbi_->meta, StrVal(k), &v, "meta schema_version"));
    if (v.mv_size != 8) return absl::DataLossError("catalog: bad schema_version entry");
    const uint64_t version = GetBE64(v.mv_data);
    if (version > kCatalogSchemaVersion) {
      return absl::FailedPreconditionError(absl::StrCat(
          "catalog: store '", dir_, "' has schema version ", version,
          ", newer than this build supports (", kCatalogSchemaVersion, "); upgrade loradb"));
    }
    if (version < kCatalogSchemaVersion) {
      return absl::FailedPreconditionError(
          absl::StrCat("catalog: store '", dir_, "' has schema version ", version,
                       "; run `loradb migrate` to move it to ", kCatalogSchemaVersion));
    }
    k = "store_id";
    LORADB_RETURN_IF_ERROR(Get(txn, dbi_->meta, StrVal(k), &v, "meta store_id"));
    store_id_.assign(static_cast<const char*>(v.mv_data), v.mv_size);
    return absl::OkStatus();
  };

  MDB_txn* txn = nullptr;
  rc = mdb_txn_begin(env_, nullptr, MDB_RDONLY, &txn);
  if (rc != 0) return LmdbError(rc, "begin read");
  absl::Status st = open_all(txn, 0);
  if (st.ok()) {
    st = read_meta(txn);
    if (st.ok()) {
      rc = mdb_txn_commit(txn);  // makes the dbi handles visible to later transactions
      if (rc != 0) return LmdbError(rc, "commit open");
      return absl::OkStatus();
    }
  }
  mdb_txn_abort(txn);
  if (!absl::IsNotFound(st)) return st;
  if (options_.read_only) {
    return absl::FailedPreconditionError(absl::StrCat("catalog: read-only catalog in '", dir_,
                                                      "' is not initialised: ", st.message()));
  }

  // A fresh environment: create the databases and write meta.
  rc = mdb_txn_begin(env_, nullptr, 0, &txn);
  if (rc != 0) return LmdbError(rc, "begin write");
  st = open_all(txn, MDB_CREATE);
  if (st.ok()) {
    // Another process may have initialised it between our two transactions.
    st = read_meta(txn);
    if (absl::IsNotFound(st)) {
      store_id_ = NewStoreId();
      U64Key ver(kCatalogSchemaVersion);
      st = Put(txn, dbi_->meta, StrVal("schema_version"), ver.val(), 0, "put meta");
      if (st.ok()) st = Put(txn, dbi_->meta, StrVal("store_id"), StrVal(store_id_), 0, "put meta");
      if (st.ok()) {
        U64Key created(static_cast<uint64_t>(Now()));
        st = Put(txn, dbi_->meta, StrVal("created_us"), created.val(), 0, "put meta");
      }
    }
  }
  if (!st.ok()) {
    mdb_txn_abort(txn);
    return st;
  }
  rc = mdb_txn_commit(txn);
  if (rc != 0) return LmdbError(rc, "commit create");
  return absl::OkStatus();
}

// ---- transactions

CatalogReadSlot* Catalog::AcquireReadSlot(int* rc) const {
  CatalogReadSlot* slot = hot_slot_.exchange(nullptr, std::memory_order_acquire);
  if (slot == nullptr) {
    MutexLock lock(&pool_mu_);
    if (idle_slots_.empty()) {
      slots_.push_back(std::make_unique<CatalogReadSlot>());
      slot = slots_.back().get();
    } else {
      slot = idle_slots_.back();
      idle_slots_.pop_back();
    }
  }
  *rc = 0;
  if (slot->txn != nullptr && mdb_txn_renew(slot->txn) != 0) {
    mdb_txn_abort(slot->txn);
    slot->txn = nullptr;
  }
  if (slot->txn == nullptr) *rc = mdb_txn_begin(env_, nullptr, MDB_RDONLY, &slot->txn);
  if (*rc != 0) {
    slot->txn = nullptr;
    MutexLock lock(&pool_mu_);
    idle_slots_.push_back(slot);
    return nullptr;
  }
  return slot;
}

void Catalog::ReleaseReadSlot(CatalogReadSlot* slot) const {
  // Views made in this transaction die here, before its pages can be reused. Only the thread
  // holding the slot writes its epoch, so a plain store (no read-modify-write) is enough.
  slot->epoch.store(slot->epoch.load(std::memory_order_relaxed) + 1, std::memory_order_release);
  mdb_txn_reset(slot->txn);
  CatalogReadSlot* none = nullptr;
  if (hot_slot_.compare_exchange_strong(none, slot, std::memory_order_release)) return;
  MutexLock lock(&pool_mu_);
  if (idle_slots_.size() >= 64) {
    mdb_txn_abort(slot->txn);  // the slot stays (stale views may still read its epoch)
    slot->txn = nullptr;
  }
  idle_slots_.push_back(slot);
}

int64_t Catalog::Now() const { return options_.clock ? options_.clock() : NowMicros(); }

absl::Status Catalog::GrowMap(uint64_t at_least) {
  WriterMutexLock lock(&resize_mu_);
  {
    // Every slot is idle here (a transaction holds resize_mu_ shared while it is open).
    MutexLock pool_lock(&pool_mu_);
    if (CatalogReadSlot* hot = hot_slot_.exchange(nullptr, std::memory_order_acquire)) {
      idle_slots_.push_back(hot);
    }
    for (CatalogReadSlot* slot : idle_slots_) {
      if (slot->txn != nullptr) mdb_txn_abort(slot->txn);
      slot->txn = nullptr;
    }
  }
  MDB_envinfo info;
  mdb_env_info(env_, &info);
  uint64_t size = info.me_mapsize;
  if (at_least > 0) {
    while (size < at_least) size *= 2;
  }
  // 0 adopts the size another process set; otherwise grow.
  int rc = mdb_env_set_mapsize(env_, static_cast<size_t>(at_least > 0 ? size : 0));
  if (rc != 0) return LmdbError(rc, "grow map");
  return absl::OkStatus();
}

absl::Status Catalog::ViewInSlot(
    absl::FunctionRef<absl::Status(MDB_txn*, const CatalogReadSlot*)> fn) const {
  for (int attempt = 0; attempt < 4; ++attempt) {
    {
      ReaderMutexLock lock(&resize_mu_);
      int rc = 0;
      CatalogReadSlot* slot = AcquireReadSlot(&rc);
      if (slot != nullptr) {
        absl::Status st = fn(slot->txn, slot);
        ReleaseReadSlot(slot);
        return st;
      }
      if (rc != MDB_MAP_RESIZED) return LmdbError(rc, "begin read");
    }
    LORADB_RETURN_IF_ERROR(const_cast<Catalog*>(this)->GrowMap(0));
  }
  return absl::InternalError("catalog: map kept resizing under a reader");
}

absl::Status Catalog::View(absl::FunctionRef<absl::Status(MDB_txn*)> fn) const {
  return ViewInSlot([&](MDB_txn* txn, const CatalogReadSlot*) { return fn(txn); });
}

absl::Status Catalog::Read(absl::FunctionRef<absl::Status(const CatalogReader&)> fn) const {
  return ViewInSlot([&](MDB_txn* txn, const CatalogReadSlot* slot) -> absl::Status {
    CatalogReader::State state(txn, dbi_.get());
    state.scope.slot = slot;
    state.scope.epoch = slot->epoch.load(std::memory_order_relaxed);
    const CatalogReader reader = CatalogViewAccess::MakeReader(&state);
    return fn(reader);
  });
}

absl::Status Catalog::Update(const std::function<absl::Status(MDB_txn*)>& fn) {
  if (options_.read_only) {
    return absl::FailedPreconditionError(absl::StrCat(
        "catalog: '", dir_, "' is open read-only (a replica); writes go to the writer"));
  }
  for (int attempt = 0; attempt < 32; ++attempt) {
    uint64_t grow_to = 0;
    bool adopt = false;
    {
      ReaderMutexLock lock(&resize_mu_);
      MDB_txn* txn = nullptr;
      int rc = mdb_txn_begin(env_, nullptr, 0, &txn);
      if (rc == MDB_MAP_RESIZED) {
        adopt = true;
      } else if (rc != 0) {
        return LmdbError(rc, "begin write");
      } else {
        catalog_lmdb::ClearMapFull();
        absl::Status st = fn(txn);
        if (st.ok()) st = FaultPoint("catalog.before_commit");
        if (st.ok()) {
          rc = mdb_txn_commit(txn);
          if (rc == 0) return FaultPoint("catalog.after_commit");
          st = LmdbError(rc, "commit");
        } else {
          mdb_txn_abort(txn);
        }
        if (!catalog_lmdb::MapFull()) return st;
        MDB_envinfo info;
        mdb_env_info(env_, &info);
        grow_to = static_cast<uint64_t>(info.me_mapsize) * 2;
      }
    }
    // No transaction of this call is open here.
    LORADB_RETURN_IF_ERROR(GrowMap(adopt ? 0 : grow_to));
  }
  return absl::ResourceExhaustedError("catalog: map full after repeated growth");
}

// ---- bases

absl::Status Catalog::PutBase(BaseRecord base) {
  LORADB_RETURN_IF_ERROR(ValidateBaseName(base.name));
  if (base.modules.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("base '", base.name, "' has an empty module table"));
  }
  std::sort(base.modules.begin(), base.modules.end(),
            [](const ModuleShape& a, const ModuleShape& b) { return a.name < b.name; });
  for (size_t i = 0; i < base.modules.size(); ++i) {
    const auto& m = base.modules[i];
    if (m.name.empty() || m.in <= 0 || m.out <= 0) {
      return absl::InvalidArgumentError(absl::StrCat("base '", base.name, "': module '", m.name,
                                                     "' needs a name and positive in/out"));
    }
    if (i > 0 && base.modules[i - 1].name == m.name) {
      return absl::InvalidArgumentError(
          absl::StrCat("base '", base.name, "': module '", m.name, "' is listed twice"));
    }
  }
  const bool stamp = base.created_us == 0;
  return Update([&](MDB_txn* txn) -> absl::Status {
    if (stamp) base.created_us = Now();
    const std::string bytes = codec::EncodeBase(base);
    absl::Status st =
        Put(txn, dbi_->bases, StrVal(base.name), StrVal(bytes), MDB_NOOVERWRITE, "put base");
    if (absl::IsAlreadyExists(st)) {
      return absl::AlreadyExistsError(absl::StrCat("base '", base.name, "' already exists"));
    }
    return st;
  });
}

absl::StatusOr<BaseRecord> Catalog::GetBase(const std::string& name) const {
  LORADB_RETURN_IF_ERROR(ValidateBaseName(name));
  BaseRecord out;
  LORADB_RETURN_IF_ERROR(View([&](MDB_txn* txn) -> absl::Status {
    MDB_val v;
    absl::Status st = Get(txn, dbi_->bases, StrVal(name), &v, "base");
    if (absl::IsNotFound(st))
      return absl::NotFoundError(absl::StrCat("no base named '", name, "'"));
    LORADB_RETURN_IF_ERROR(st);
    LORADB_ASSIGN_OR_RETURN(out, codec::DecodeBase(ValBytes(v)));
    return absl::OkStatus();
  }));
  return out;
}

absl::StatusOr<std::vector<BaseRecord>> Catalog::ListBases() const {
  std::vector<BaseRecord> out;
  LORADB_RETURN_IF_ERROR(View([&](MDB_txn* txn) -> absl::Status {
    Cursor c(txn, dbi_->bases);
    LORADB_RETURN_IF_ERROR(c.status());
    MDB_val k, v;
    for (int rc = c.Get(&k, &v, MDB_FIRST); rc == 0; rc = c.Get(&k, &v, MDB_NEXT)) {
      LORADB_ASSIGN_OR_RETURN(BaseRecord b, codec::DecodeBase(ValBytes(v)));
      out.push_back(std::move(b));
    }
    return absl::OkStatus();
  }));
  return out;
}

// ---- policies

absl::StatusOr<PolicyRecord> Catalog::CreatePolicy(
    const std::string& name, const std::string& base,
    const std::map<std::string, std::string>& labels) {
  PolicyRecord p;
  LORADB_RETURN_IF_ERROR(Update([&](MDB_txn* txn) -> absl::Status {
    LORADB_ASSIGN_OR_RETURN(p, TxnCreatePolicy(txn, *dbi_, name, base, labels, Now()));
    return absl::OkStatus();
  }));
  return p;
}

absl::StatusOr<PolicyRecord> Catalog::GetPolicy(const std::string& name) const {
  PolicyRecord out;
  LORADB_RETURN_IF_ERROR(View([&](MDB_txn* txn) -> absl::Status {
    LORADB_ASSIGN_OR_RETURN(out, TxnGetPolicy(txn, *dbi_, name));
    return absl::OkStatus();
  }));
  return out;
}

absl::StatusOr<PolicyRecord> Catalog::GetPolicyById(uint64_t id) const {
  PolicyRecord out;
  LORADB_RETURN_IF_ERROR(View([&](MDB_txn* txn) -> absl::Status {
    LORADB_ASSIGN_OR_RETURN(out, TxnGetPolicyById(txn, *dbi_, id));
    return absl::OkStatus();
  }));
  return out;
}

absl::StatusOr<std::vector<PolicyRecord>> Catalog::ListPolicies() const {
  std::vector<PolicyRecord> out;
  LORADB_RETURN_IF_ERROR(View([&](MDB_txn* txn) -> absl::Status {
    Cursor c(txn, dbi_->policy_by_id);
    LORADB_RETURN_IF_ERROR(c.status());
    MDB_val k, v;
    for (int rc = c.Get(&k, &v, MDB_FIRST); rc == 0; rc = c.Get(&k, &v, MDB_NEXT)) {
      if (k.mv_size != 8) return absl::DataLossError("catalog: policy key is not 8 bytes");
      LORADB_ASSIGN_OR_RETURN(PolicyRecord p, codec::DecodePolicy(ValBytes(v), GetBE64(k.mv_data)));
      LORADB_RETURN_IF_ERROR(ResolveNextSeq(txn, *dbi_, &p));
      out.push_back(std::move(p));
    }
    return absl::OkStatus();
  }));
  return out;
}

absl::Status Catalog::SetPolicyArchived(const std::string& name, bool archived) {
  return Update([&](MDB_txn* txn) -> absl::Status {
    LORADB_ASSIGN_OR_RETURN(PolicyRecord p, TxnGetPolicy(txn, *dbi_, name));
    if (p.archived == archived) return absl::OkStatus();
    p.archived = archived;
    return TxnPutPolicy(txn, *dbi_, p);
  });
}

// ---- revisions

absl::StatusOr<RevisionRecord> Catalog::Publish(const NewRevision& rev,
                                                const std::string& blob_relpath) {
  RevisionRecord out;
  LORADB_RETURN_IF_ERROR(Update([&](MDB_txn* txn) -> absl::Status {
    TxnPublisher publisher(txn, *dbi_, Now());
    LORADB_RETURN_IF_ERROR(publisher.Publish(rev, blob_relpath, &out).status());
    return publisher.Finish();
  }));
  return out;
}

absl::StatusOr<std::vector<uint64_t>> Catalog::PublishBatch(
    std::span<const NewRevision> revs, std::span<const std::string> blob_relpaths) {
  if (!blob_relpaths.empty() && blob_relpaths.size() != revs.size()) {
    return absl::InvalidArgumentError("PublishBatch: one blob path per revision (or none)");
  }
  std::vector<uint64_t> ids;
  static const std::string kNoPath;
  LORADB_RETURN_IF_ERROR(Update([&](MDB_txn* txn) -> absl::Status {
    TxnPublisher publisher(txn, *dbi_, Now());
    ids.clear();
    ids.reserve(revs.size());
    for (size_t i = 0; i < revs.size(); ++i) {
      LORADB_ASSIGN_OR_RETURN(
          const uint64_t id,
          publisher.Publish(revs[i], blob_relpaths.empty() ? kNoPath : blob_relpaths[i], nullptr));
      ids.push_back(id);
    }
    return publisher.Finish();
  }));
  return ids;
}

absl::StatusOr<RevisionRecord> Catalog::GetRevision(uint64_t id) const {
  RevisionRecord out;
  LORADB_RETURN_IF_ERROR(Read([&](const CatalogReader& r) -> absl::Status {
    LORADB_ASSIGN_OR_RETURN(RevisionView v, r.Revision(id));
    out = v.ToRecord();
    return absl::OkStatus();
  }));
  return out;
}

absl::StatusOr<RevisionRecord> Catalog::GetRevisionBySeq(uint64_t policy_id, uint64_t seq) const {
  RevisionRecord out;
  LORADB_RETURN_IF_ERROR(Read([&](const CatalogReader& r) -> absl::Status {
    LORADB_ASSIGN_OR_RETURN(RevisionView v, r.RevisionBySeq(policy_id, seq));
    out = v.ToRecord();
    return absl::OkStatus();
  }));
  return out;
}

absl::StatusOr<RevisionRecord> Catalog::GetRevisionByAlias(uint64_t policy_id,
                                                           const std::string& alias) const {
  LORADB_RETURN_IF_ERROR(ValidateAliasName(alias));
  RevisionRecord out;
  LORADB_RETURN_IF_ERROR(Read([&](const CatalogReader& r) -> absl::Status {
    LORADB_ASSIGN_OR_RETURN(RevisionView v, r.RevisionByAlias(policy_id, alias));
    out = v.ToRecord();
    return absl::OkStatus();
  }));
  return out;
}

absl::StatusOr<Page<RevisionRecord>> Catalog::ListPolicyRevisions(uint64_t policy_id,
                                                                  uint64_t after_seq, size_t limit,
                                                                  bool include_deleted) const {
  Page<RevisionRecord> page;
  LORADB_RETURN_IF_ERROR(View([&](MDB_txn* txn) -> absl::Status {
    page = {};
    CatalogViewScope scope(txn, dbi_.get());  // views die with this lambda; the page keeps owning
                                              // records
    Cursor c(txn, dbi_->policy_revisions);
    LORADB_RETURN_IF_ERROR(c.status());
    if (after_seq == UINT64_MAX) return absl::OkStatus();
    U64Key pk(policy_id);
    U128Key probe(after_seq + 1, 0);
    MDB_val k = pk.val(), v = probe.val();
    // Only this policy's duplicates are touched: (seq, id) entries in seq order.
    int rc = c.Get(&k, &v, MDB_GET_BOTH_RANGE);
    if (rc == MDB_NOTFOUND) return absl::OkStatus();
    if (rc != 0) return LmdbError(rc, "policy revision index");
    while (rc == 0) {
      if (limit > 0 && page.items.size() >= limit) {
        page.next_after = page.items.back().seq;
        return absl::OkStatus();
      }
      const auto* e = static_cast<const uint8_t*>(v.mv_data);
      LORADB_ASSIGN_OR_RETURN(RevisionView r, TxnRevisionView(txn, *dbi_, GetBE64(e + 8), scope));
      if (include_deleted || r.live()) page.items.push_back(r.ToRecord());
      rc = c.Get(&k, &v, MDB_NEXT_DUP);
    }
    if (rc != MDB_NOTFOUND) return LmdbError(rc, "policy revision index");
    return absl::OkStatus();
  }));
  return page;
}

absl::StatusOr<Page<RevisionRecord>> Catalog::ListRevisions(uint64_t after_id, size_t limit,
                                                            bool include_deleted) const {
  Page<RevisionRecord> page;
  LORADB_RETURN_IF_ERROR(View([&](MDB_txn* txn) -> absl::Status {
    page = {};
    if (after_id == UINT64_MAX) return absl::OkStatus();
    CatalogViewScope scope(txn, dbi_.get());  // views die with this lambda; the page keeps owning
                                              // records
    Cursor c(txn, dbi_->revisions);
    LORADB_RETURN_IF_ERROR(c.status());
    U64Key start(after_id + 1);
    MDB_val k = start.val(), v;
    int rc = c.Get(&k, &v, MDB_SET_RANGE);
    while (rc == 0) {
      if (limit > 0 && page.items.size() >= limit) {
        page.next_after = page.items.back().id;
        return absl::OkStatus();
      }
      LORADB_ASSIGN_OR_RETURN(
          RevisionView r, catalog_lmdb::ViewRevisionBytes(ValBytes(v), GetBE64(k.mv_data), scope));
      if (include_deleted || r.live()) page.items.push_back(r.ToRecord());
      rc = c.Get(&k, &v, MDB_NEXT);
    }
    if (rc != MDB_NOTFOUND) return LmdbError(rc, "revisions");
    return absl::OkStatus();
  }));
  return page;
}

absl::Status Catalog::ScanRevisionsRaw(
    const std::function<void(uint64_t, std::span<const uint8_t>)>& fn) const {
  return View([&](MDB_txn* txn) -> absl::Status {
    Cursor c(txn, dbi_->revisions);
    LORADB_RETURN_IF_ERROR(c.status());
    MDB_val k, v;
    int rc = c.Get(&k, &v, MDB_FIRST);
    for (; rc == 0; rc = c.Get(&k, &v, MDB_NEXT)) fn(GetBE64(k.mv_data), ValBytes(v));
    if (rc != MDB_NOTFOUND) return LmdbError(rc, "scan revisions");
    return absl::OkStatus();
  });
}

absl::StatusOr<uint64_t> Catalog::CountPolicyRevisions(uint64_t policy_id) const {
  uint64_t n = 0;
  LORADB_RETURN_IF_ERROR(View([&](MDB_txn* txn) -> absl::Status {
    Cursor c(txn, dbi_->policy_revisions);
    LORADB_RETURN_IF_ERROR(c.status());
    U64Key pk(policy_id);
    MDB_val k = pk.val(), v;
    int rc = c.Get(&k, &v, MDB_SET);
    if (rc == MDB_NOTFOUND) return absl::OkStatus();
    if (rc != 0) return LmdbError(rc, "policy revision index");
    // Reads the fixed-size entries a page at a time.
    rc = c.Get(&k, &v, MDB_GET_MULTIPLE);
    while (rc == 0) {
      n += v.mv_size / 16;
      rc = c.Get(&k, &v, MDB_NEXT_MULTIPLE);
    }
    if (rc != MDB_NOTFOUND) return LmdbError(rc, "policy revision index");
    return absl::OkStatus();
  }));
  return n;
}

absl::Status Catalog::DeleteRevision(uint64_t id) {
  return Update([&](MDB_txn* txn) -> absl::Status {
    LORADB_ASSIGN_OR_RETURN(RevisionRecord r, TxnGetRevision(txn, *dbi_, id));
    if (r.state == RevisionState::kDeleted) {
      return absl::FailedPreconditionError(absl::StrCat("revision ", id, " is already deleted"));
    }
    // Refuse while any alias of its policy points at it (the `to` of the alias's last entry).
    LORADB_RETURN_IF_ERROR(TxnForEachAlias(
        txn, *dbi_, r.policy_id, [&](absl::string_view alias, uint64_t to) -> absl::Status {
          if (to != id) return absl::OkStatus();
          return absl::FailedPreconditionError(absl::StrCat("revision ", id,
                                                            " is served by alias '", alias,
                                                            "'; move the alias before deleting"));
        }));
    r.state = RevisionState::kDeleted;
    LORADB_RETURN_IF_ERROR(TxnPutRevision(txn, *dbi_, r, 0));
    return TxnUnrefBlob(txn, *dbi_, r.blob);
  });
}

absl::Status Catalog::SetEvalScore(uint64_t id, const std::string& name, float value) {
  if (name.empty()) return absl::InvalidArgumentError("eval score needs a name");
  return Update([&](MDB_txn* txn) -> absl::Status {
    LORADB_ASSIGN_OR_RETURN(RevisionRecord r, TxnGetRevision(txn, *dbi_, id));
    r.evals[name] = value;
    return TxnPutRevision(txn, *dbi_, r, 0);
  });
}

// ---- aliases

absl::Status Catalog::SetAlias(uint64_t policy_id, const std::string& alias, uint64_t revision,
                               const std::string& reason) {
  return Update([&](MDB_txn* txn) -> absl::Status {
    LORADB_ASSIGN_OR_RETURN(PolicyRecord p, TxnGetPolicyById(txn, *dbi_, policy_id));
    return TxnSetAlias(txn, *dbi_, p, alias, revision, reason, Now());
  });
}

absl::StatusOr<uint64_t> Catalog::Rollback(uint64_t policy_id, const std::string& alias) {
  LORADB_RETURN_IF_ERROR(ValidateAliasName(alias));
  uint64_t target = 0;
  LORADB_RETURN_IF_ERROR(Update([&](MDB_txn* txn) -> absl::Status {
    LORADB_ASSIGN_OR_RETURN(PolicyRecord p, TxnGetPolicyById(txn, *dbi_, policy_id));
    auto last = TxnLastAliasLog(txn, *dbi_, policy_id, alias);
    if (absl::IsNotFound(last.status())) {
      return absl::NotFoundError(
          absl::StrCat("alias '", alias, "' of policy '", p.name, "' was never set"));
    }
    LORADB_RETURN_IF_ERROR(last.status());
    target = last->from_revision;
    if (target == 0) {
      return absl::FailedPreconditionError(absl::StrCat("alias '", alias, "' of policy '", p.name,
                                                        "' has no earlier value to roll back to"));
    }
    CatalogViewScope scope(txn, dbi_.get());
    LORADB_ASSIGN_OR_RETURN(RevisionView r, TxnRevisionView(txn, *dbi_, target, scope));
    if (!r.live()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "cannot roll back alias '", alias, "': its earlier revision ", target, " is deleted"));
    }
    return TxnSetAlias(txn, *dbi_, p, alias, target, "rollback", Now());
  }));
  return target;
}

absl::StatusOr<std::vector<AliasEntry>> Catalog::ListAliases(uint64_t policy_id) const {
  std::vector<AliasEntry> out;
  LORADB_RETURN_IF_ERROR(View([&](MDB_txn* txn) -> absl::Status {
    out.clear();
    LORADB_RETURN_IF_ERROR(
        TxnForEachAlias(txn, *dbi_, policy_id, [&](absl::string_view alias, uint64_t to) {
          out.push_back({std::string(alias), to});
          return absl::OkStatus();
        }));
    // The log's keys order aliases by length first; listings show them by name.
    std::sort(out.begin(), out.end(),
              [](const AliasEntry& a, const AliasEntry& b) { return a.alias < b.alias; });
    return absl::OkStatus();
  }));
  return out;
}

absl::StatusOr<std::vector<AliasLogEntry>> Catalog::AliasLog(uint64_t policy_id,
                                                             const std::string& alias) const {
  LORADB_RETURN_IF_ERROR(ValidateAliasName(alias));
  std::vector<AliasLogEntry> out;
  LORADB_RETURN_IF_ERROR(View([&](MDB_txn* txn) -> absl::Status {
    out.clear();
    Cursor c(txn, dbi_->alias_log);
    LORADB_RETURN_IF_ERROR(c.status());
    AliasLogKey key(policy_id, alias);
    const MDB_val prefix = key.prefix();
    MDB_val k = prefix, v;
    int rc = c.Get(&k, &v, MDB_SET_RANGE);
    for (; rc == 0 && catalog_lmdb::IsEntryOf(k, prefix); rc = c.Get(&k, &v, MDB_NEXT)) {
      LORADB_ASSIGN_OR_RETURN(AliasLogEntry e, codec::DecodeAliasLogEntry(ValBytes(v)));
      e.alias = alias;
      e.seq = GetBE64(static_cast<const uint8_t*>(k.mv_data) + key.prefix_size);
      out.push_back(std::move(e));
    }
    if (rc != 0 && rc != MDB_NOTFOUND) return LmdbError(rc, "alias log");
    return absl::OkStatus();
  }));
  return out;
}

// ---- checkpoints

absl::StatusOr<CheckpointRecord> Catalog::PutCheckpoint(const NewCheckpoint& nc) {
  CheckpointRecord out;
  LORADB_RETURN_IF_ERROR(Update([&](MDB_txn* txn) -> absl::Status {
    LORADB_ASSIGN_OR_RETURN(PolicyRecord p, TxnGetPolicyById(txn, *dbi_, nc.policy_id));
    if (nc.master.empty()) {
      return absl::InvalidArgumentError("a checkpoint needs master adapter weights");
    }
    LORADB_ASSIGN_OR_RETURN(uint64_t last, LastU64Key(txn, dbi_->checkpoints));
    if (nc.parent != 0) {
      U64Key pk(nc.parent);
      MDB_val v;
      absl::Status st = Get(txn, dbi_->checkpoints, pk.val(), &v, "checkpoint");
      if (absl::IsNotFound(st)) {
        return absl::NotFoundError(absl::StrCat("parent checkpoint ", nc.parent, " not found"));
      }
      LORADB_RETURN_IF_ERROR(st);
    }
    out = CheckpointRecord{};
    out.id = last + 1;
    out.policy_id = p.id;
    out.step = nc.step;
    out.parent = nc.parent;
    out.master = nc.master;
    out.optimizer = nc.optimizer;
    out.gradients = nc.gradients;
    out.scheduler_name = nc.scheduler_name;
    out.scheduler_position = nc.scheduler_position;
    out.rng_state = nc.rng_state;
    out.rollout = nc.rollout;
    out.created_us = Now();
    U64Key k(out.id);
    const std::string bytes = codec::EncodeCheckpoint(out);
    LORADB_RETURN_IF_ERROR(
        Put(txn, dbi_->checkpoints, k.val(), StrVal(bytes), MDB_APPEND, "put checkpoint"));
    U64Key pk(p.id);
    U128Key entry(out.step, out.id);
    LORADB_RETURN_IF_ERROR(
        Put(txn, dbi_->policy_checkpoints, pk.val(), entry.val(), 0, "put checkpoint index"));
    for (const BlobRef* b : {&out.master, &out.optimizer, &out.gradients, &out.rollout}) {
      LORADB_RETURN_IF_ERROR(TxnRefBlob(txn, *dbi_, *b, "", BlobKind::kCheckpoint));
    }
    return absl::OkStatus();
  }));
  return out;
}

absl::StatusOr<CheckpointRecord> Catalog::GetCheckpoint(uint64_t id) const {
  CheckpointRecord out;
  LORADB_RETURN_IF_ERROR(View([&](MDB_txn* txn) -> absl::Status {
    U64Key k(id);
    MDB_val v;
    absl::Status st = Get(txn, dbi_->checkpoints, k.val(), &v, "checkpoint");
    if (absl::IsNotFound(st))
      return absl::NotFoundError(absl::StrCat("no checkpoint with id ", id));
    LORADB_RETURN_IF_ERROR(st);
    LORADB_ASSIGN_OR_RETURN(out, codec::DecodeCheckpoint(ValBytes(v)));
    return absl::OkStatus();
  }));
  return out;
}

absl::StatusOr<std::vector<CheckpointRecord>> Catalog::ListCheckpoints(uint64_t policy_id) const {
  std::vector<CheckpointRecord> out;
  LORADB_RETURN_IF_ERROR(View([&](MDB_txn* txn) -> absl::Status {
    Cursor c(txn, dbi_->policy_checkpoints);
    LORADB_RETURN_IF_ERROR(c.status());
    U64Key pk(policy_id);
    MDB_val k = pk.val(), v;
    int rc = c.Get(&k, &v, MDB_SET);
    while (rc == 0) {
      U64Key ck(GetBE64(static_cast<const uint8_t*>(v.mv_data) + 8));
      MDB_val cv;
      LORADB_RETURN_IF_ERROR(Get(txn, dbi_->checkpoints, ck.val(), &cv, "checkpoint"));
      LORADB_ASSIGN_OR_RETURN(CheckpointRecord r, codec::DecodeCheckpoint(ValBytes(cv)));
      out.push_back(std::move(r));
      rc = c.Get(&k, &v, MDB_NEXT_DUP);
    }
    if (rc != MDB_NOTFOUND) return LmdbError(rc, "checkpoint index");
    return absl::OkStatus();
  }));
  return out;
}

// ---- blobs

absl::StatusOr<BlobRecord> Catalog::GetBlob(const Hash128& hash) const {
  BlobRecord out;
  LORADB_RETURN_IF_ERROR(View([&](MDB_txn* txn) -> absl::Status {
    U128Key k(hash.high, hash.low);
    MDB_val v;
    absl::Status st = Get(txn, dbi_->blobs, k.val(), &v, "blob");
    if (absl::IsNotFound(st)) return absl::NotFoundError(absl::StrCat("no blob ", hash.Hex()));
    LORADB_RETURN_IF_ERROR(st);
    LORADB_ASSIGN_OR_RETURN(out, codec::DecodeBlob(ValBytes(v)));
    out.hash = hash;
    return absl::OkStatus();
  }));
  return out;
}

absl::StatusOr<std::vector<BlobRecord>> Catalog::ListBlobs() const {
  std::vector<BlobRecord> out;
  LORADB_RETURN_IF_ERROR(View([&](MDB_txn* txn) -> absl::Status {
    Cursor c(txn, dbi_->blobs);
    LORADB_RETURN_IF_ERROR(c.status());
    MDB_val k, v;
    for (int rc = c.Get(&k, &v, MDB_FIRST); rc == 0; rc = c.Get(&k, &v, MDB_NEXT)) {
      if (k.mv_size != 16) return absl::DataLossError("catalog: blob key is not 16 bytes");
      LORADB_ASSIGN_OR_RETURN(BlobRecord b, codec::DecodeBlob(ValBytes(v)));
      b.hash = Hash128{GetBE64(k.mv_data), GetBE64(static_cast<const uint8_t*>(k.mv_data) + 8)};
      out.push_back(std::move(b));
    }
    return absl::OkStatus();
  }));
  return out;
}

absl::StatusOr<std::vector<uint64_t>> Catalog::ListRevisionsByBlob(const Hash128& hash) const {
  std::vector<uint64_t> out;
  LORADB_RETURN_IF_ERROR(View([&](MDB_txn* txn) -> absl::Status {
    out.clear();
    Cursor c(txn, dbi_->revisions_by_blob);
    LORADB_RETURN_IF_ERROR(c.status());
    U128Key bk(hash.high, hash.low);
    MDB_val k = bk.val(), v;
    int rc = c.Get(&k, &v, MDB_SET);
    for (; rc == 0; rc = c.Get(&k, &v, MDB_NEXT_DUP)) out.push_back(GetBE64(v.mv_data));
    if (rc != MDB_NOTFOUND) return LmdbError(rc, "revisions-by-blob index");
    return absl::OkStatus();
  }));
  return out;
}

absl::StatusOr<uint64_t> Catalog::LastTxnId() const {
  MDB_envinfo info;
  const int rc = mdb_env_info(env_, &info);
  if (rc != 0) return LmdbError(rc, "env info");
  return static_cast<uint64_t>(info.me_last_txnid);
}

absl::StatusOr<uint64_t> Catalog::CopySnapshot(const std::string& dest_dir) const {
  const std::string data = dest_dir + "/data.mdb";
  struct stat sb;
  if (::stat(data.c_str(), &sb) == 0) {
    return absl::AlreadyExistsError(absl::StrCat("catalog: snapshot target ", data, " exists"));
  }
  // Read before the copy's own read transaction begins: a lower bound of what it holds.
  LORADB_ASSIGN_OR_RETURN(const uint64_t txnid, LastTxnId());
  {
    ReaderMutexLock lock(&resize_mu_);
    const int rc = mdb_env_copy2(env_, dest_dir.c_str(), MDB_CP_COMPACT);
    if (rc != 0) return LmdbError(rc, absl::StrCat("copy to ", dest_dir));
  }
  const int fd = ::open(data.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return ErrnoToStatus(errno, absl::StrCat("catalog: open ", data));
  const int rc = ::fsync(fd);
  const int err = errno;
  ::close(fd);
  if (rc != 0) return ErrnoToStatus(err, absl::StrCat("catalog: fsync ", data));
  LORADB_RETURN_IF_ERROR(FsyncDirectory(dest_dir));
  return txnid;
}

}  // namespace loradb
