// loradb-bench compact [--revisions N[,N...]] [--policies P] [--dir DIR]
// Per N: a store of N synthetic revisions over P policies (64 small real blob files), half of
// them deleted; then `CompactStore` (rebuild + verify + swap + blob collection) timed, catalog
// bytes before and after, compared with mdb_env_copy2(MDB_CP_COMPACT) of the same file; and a v1
// store of N revisions (half deleted) written by the v1 writer, migrated to v2 and timed.
#include <lmdb.h>
#include <sys/stat.h>

#include <CLI/CLI.hpp>
#include <filesystem>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "bench/bench_util.h"
#include "storage/catalog/catalog.h"
#include "storage/maintenance/maintenance.h"
#include "storage/maintenance/rebuild.h"
#include "storage/util/file_util.h"
#include "storage/util/hash.h"
#include "storage/util/status_macros.h"

namespace loradb::bench {
namespace {

struct CompactBenchArgs {
  std::vector<uint64_t> sizes = {10000, 100000, 1000000};
  uint64_t policies = 1000;
  std::string dir;
};

absl::StatusOr<CompactBenchArgs> ParseArgs(const std::vector<std::string>& args) {
  CompactBenchArgs a;
  CLI::App app("compact: compaction time and size at several catalog sizes", "compact");
  app.add_option("--revisions", a.sizes, "catalog sizes (revisions), comma-separated")
      ->delimiter(',')
      ->check(CLI::Range(uint64_t{2}, uint64_t{1} << 40));
  app.add_option("--policies", a.policies, "policies the revisions are spread over")
      ->check(CLI::PositiveNumber);
  app.add_option("--dir", a.dir, "work directory (default: a temporary one)");
  LORADB_RETURN_IF_ERROR(ParseFlags(&app, args));
  return a;
}

uint64_t FileBytes(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 ? static_cast<uint64_t>(st.st_size) : 0;
}

constexpr int kBlobs = 64;

// Writes kBlobs small blob files (content-addressed by xxh3-128) and returns their references.
absl::StatusOr<std::vector<BlobRef>> WriteBlobs(const std::string& store) {
  std::vector<BlobRef> out;
  for (int b = 0; b < kBlobs; ++b) {
    std::string bytes(4096 + static_cast<size_t>(b), static_cast<char>(b));
    const Hash128 h = Xxh3_128(bytes.data(), bytes.size());
    const std::string path = absl::StrCat(store, "/blobs/", BlobRelPath(h));
    LORADB_RETURN_IF_ERROR(CreateDirectories(std::filesystem::path(path).parent_path().string()));
    LORADB_RETURN_IF_ERROR(WriteFileAtomic(path, bytes));
    out.push_back(BlobRef{h, bytes.size(), 1});
  }
  return out;
}

NewRevision Synthetic(uint64_t policy_id, uint64_t i, const std::vector<BlobRef>& blobs) {
  NewRevision r;
  r.policy_id = policy_id;
  r.lora.r = 16;
  r.lora.alpha = 32;
  r.lora.target_modules = {"q_proj", "v_proj"};
  r.dtype = "BF16";
  r.source.kind = SourceKind::kTrained;
  r.source.checkpoint_id = i + 1;
  r.source.step = (i + 1) * 10;
  r.blob = blobs[i % blobs.size()];
  return r;
}

// A v2 store of n revisions with every odd id deleted.
absl::Status BuildStore(const std::string& store, uint64_t n, uint64_t policies) {
  LORADB_ASSIGN_OR_RETURN(std::vector<BlobRef> blobs, WriteBlobs(store));
  CatalogOptions o;
  o.no_sync = true;  // setup only; compaction itself syncs
  LORADB_ASSIGN_OR_RETURN(std::shared_ptr<Catalog> cat, Catalog::Open(store, o));
  BaseRecord base;
  base.name = "bench-base";
  base.arch.family = "custom";
  base.modules = {{"layers.0.self_attn.q_proj", 2048, 2048}};
  LORADB_RETURN_IF_ERROR(cat->PutBase(base));
  for (uint64_t p = 0; p < policies; ++p) {
    LORADB_RETURN_IF_ERROR(cat->CreatePolicy(absl::StrCat("t", p, "/policy"), base.name).status());
  }
  const uint64_t batch = 10000;
  for (uint64_t i = 0; i < n; i += batch) {
    std::vector<NewRevision> revs;
    std::vector<std::string> paths;
    for (uint64_t j = i; j < std::min(n, i + batch); ++j) {
      revs.push_back(Synthetic(j % policies + 1, j, blobs));
      paths.push_back(BlobRelPath(revs.back().blob.hash));
    }
    LORADB_RETURN_IF_ERROR(cat->PublishBatch(revs, paths).status());
  }
  for (uint64_t id = 1; id <= n; id += 2) LORADB_RETURN_IF_ERROR(cat->DeleteRevision(id));
  return absl::OkStatus();
}

// A v1 store of n revisions (every odd id deleted) written by the v1 writer.
absl::Status BuildV1Store(const std::string& store, uint64_t n, uint64_t policies) {
  LORADB_ASSIGN_OR_RETURN(std::vector<BlobRef> blobs, WriteBlobs(store));
  maint_internal::V1Catalog cat;
  BaseRecord base;
  base.name = "bench-base";
  base.arch.family = "custom";
  base.modules = {{"layers.0.self_attn.q_proj", 2048, 2048}};
  cat.bases.push_back(base);
  for (uint64_t p = 1; p <= policies; ++p) {
    PolicyRecord pr;
    pr.id = p;
    pr.name = absl::StrCat("t", p - 1, "/policy");
    pr.base = base.name;
    pr.next_seq = (n - (p - 1) + policies - 1) / policies + 1;  // revisions p, p+P, ... get seq 1..
    cat.policies.push_back(pr);
  }
  std::vector<uint64_t> refs(blobs.size(), 0);
  cat.generated_revisions = n;
  cat.generate_revision = [&](uint64_t id) {
    const NewRevision nr = Synthetic((id - 1) % policies + 1, id - 1, blobs);
    RevisionRecord r;
    r.id = id;
    r.policy_id = nr.policy_id;
    r.seq = (id - 1) / policies + 1;
    r.base = base.name;
    r.source = nr.source;
    r.lora = nr.lora;
    r.dtype = nr.dtype;
    r.blob = nr.blob;
    r.created_us = 1700000000000000 + static_cast<int64_t>(id);
    r.state = id % 2 == 1 ? RevisionState::kDeleted : RevisionState::kLive;
    return r;
  };
  for (uint64_t id = 2; id <= n; id += 2) ++refs[(id - 1) % blobs.size()];
  for (size_t b = 0; b < blobs.size(); ++b) {
    BlobRecord br;
    br.hash = blobs[b].hash;
    br.relpath = BlobRelPath(blobs[b].hash);
    br.bytes = blobs[b].bytes;
    br.refcount = refs[b];
    cat.blobs.push_back(br);
  }
  return maint_internal::WriteV1Catalog(store, cat, /*no_sync=*/true);
}

absl::Status CopyCompact(const std::string& store, const std::string& to) {
  std::filesystem::create_directories(to);
  MDB_env* env = nullptr;
  int rc = mdb_env_create(&env);
  if (rc == 0) rc = mdb_env_set_maxdbs(env, 16);
  if (rc == 0) rc = mdb_env_open(env, (store + "/catalog").c_str(), MDB_RDONLY | MDB_NOTLS, 0644);
  if (rc == 0) rc = mdb_env_copy2(env, to.c_str(), MDB_CP_COMPACT);
  if (env != nullptr) mdb_env_close(env);
  if (rc != 0) return absl::InternalError(absl::StrCat("mdb_env_copy2: ", mdb_strerror(rc)));
  return absl::OkStatus();
}

struct Row {
  uint64_t n;
  double compact_s, migrate_s;
};

absl::Status RunOne(const CompactBenchArgs& args, uint64_t n, const std::string& root,
                    std::vector<Row>* rows) {
  const std::string store = absl::StrCat(root, "/compact-", n);
  std::filesystem::remove_all(store);
  Progress(absl::StrCat("compact: building ", n, " revisions, half deleted"));
  LORADB_RETURN_IF_ERROR(BuildStore(store, n, args.policies));
  const uint64_t before = FileBytes(store + "/catalog/data.mdb");

  const std::string copy_dir = store + "-copy";
  double t0 = NowSeconds();
  LORADB_RETURN_IF_ERROR(CopyCompact(store, copy_dir));
  const double copy_s = NowSeconds() - t0;
  const uint64_t copy_bytes = FileBytes(copy_dir + "/data.mdb");
  std::filesystem::remove_all(copy_dir);

  Progress(absl::StrCat("compact: compacting ", n));
  CompactOptions o;
  LORADB_ASSIGN_OR_RETURN(CompactReport rep, CompactStore(store, o));
  if (rep.catalog_bytes_before != before || rep.live_revisions_kept != n / 2) {
    return absl::InternalError("compaction report does not match the store built");
  }
  const double ratio = static_cast<double>(rep.catalog_bytes_after) / static_cast<double>(before);
  const double copy_ratio = static_cast<double>(copy_bytes) / static_cast<double>(before);
  Emit({{"bench", "compact"},
        {"case", "compact"},
        {"revisions", n},
        {"deleted", rep.dropped_deleted},
        {"seconds", rep.seconds},
        {"rebuild_seconds", rep.rebuild_seconds},
        {"verify_seconds", rep.verify_seconds},
        {"swap_seconds", rep.swap_seconds},
        {"revisions_per_s", static_cast<double>(n) / rep.seconds},
        {"bytes_before", before},
        {"bytes_after", rep.catalog_bytes_after},
        {"ratio", ratio},
        {"copy_compact_bytes", copy_bytes},
        {"copy_compact_ratio", copy_ratio},
        {"copy_compact_seconds", copy_s}});
  EmitGoal("compact", absl::StrCat("rebuild_beats_copy_compact_", n), ratio,
           absl::StrCat("< ", copy_ratio, " (mdb_env_copy2 MDB_CP_COMPACT, same file)"),
           ratio < copy_ratio);
  std::filesystem::remove_all(store);

  const std::string v1 = absl::StrCat(root, "/migrate-", n);
  std::filesystem::remove_all(v1);
  Progress(absl::StrCat("compact: writing a v1 store of ", n, " revisions"));
  LORADB_RETURN_IF_ERROR(BuildV1Store(v1, n, args.policies));
  const uint64_t v1_bytes = FileBytes(v1 + "/catalog/data.mdb");
  LORADB_ASSIGN_OR_RETURN(MigrateReport mig, MigrateStore(v1, {}));
  if (mig.from_version != 1 || mig.index_entries != n) {
    return absl::InternalError("migration report does not match the v1 store");
  }
  Emit({{"bench", "compact"},
        {"case", "migrate_v1_v2"},
        {"revisions", n},
        {"seconds", mig.seconds},
        {"rebuild_seconds", mig.rebuild_seconds},
        {"verify_seconds", mig.verify_seconds},
        {"swap_seconds", mig.swap_seconds},
        {"revisions_per_s", static_cast<double>(n) / mig.seconds},
        {"bytes_before", v1_bytes},
        {"bytes_after", mig.catalog_bytes_after},
        {"index_entries", mig.index_entries}});
  std::filesystem::remove_all(v1);
  rows->push_back({n, rep.seconds, mig.seconds});
  return absl::OkStatus();
}

absl::Status RunCompactBench(const std::vector<std::string>& argv) {
  LORADB_ASSIGN_OR_RETURN(CompactBenchArgs args, ParseArgs(argv));
  std::string root = args.dir;
  if (root.empty()) {
    root = (std::filesystem::temp_directory_path() / "loradb-compact-bench").string();
  }
  std::error_code ec;
  std::filesystem::create_directories(root, ec);
  if (ec) return absl::InternalError(absl::StrCat("cannot create ", root, ": ", ec.message()));
  std::vector<Row> rows;
  for (uint64_t n : args.sizes) LORADB_RETURN_IF_ERROR(RunOne(args, n, root, &rows));
  // Cost growth: seconds per revision at the largest size over the smallest (1 = linear).
  if (rows.size() >= 2) {
    const Row& a = rows.front();
    const Row& b = rows.back();
    const double growth =
        (b.compact_s / static_cast<double>(b.n)) / (a.compact_s / static_cast<double>(a.n));
    const double mgrowth =
        (b.migrate_s / static_cast<double>(b.n)) / (a.migrate_s / static_cast<double>(a.n));
    Emit({{"bench", "compact"},
          {"case", "growth"},
          {"from_revisions", a.n},
          {"to_revisions", b.n},
          {"compact_per_revision_ratio", growth},
          {"migrate_per_revision_ratio", mgrowth}});
    EmitGoal("compact", absl::StrCat("compact_cost_growth_", a.n, "_to_", b.n), growth,
             "<= 2 (per-revision time, near-linear)", growth <= 2);
    EmitGoal("compact", absl::StrCat("migrate_cost_growth_", a.n, "_to_", b.n), mgrowth,
             "<= 2 (per-revision time, near-linear)", mgrowth <= 2);
  }
  std::filesystem::remove_all(root, ec);
  return absl::OkStatus();
}

LORADB_REGISTER_SCENARIO({"compact",
                          "offline compaction (half deleted) and v1->v2 migration at --revisions "
                          "N[,N...]",
                          RunCompactBench,
                          {"--revisions", "10000,100000,1000000"}});

}  // namespace
}  // namespace loradb::bench
